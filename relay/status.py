"""Who publishes what, from outside the relays: ``outboxkit relay status``.

Kafka knows the members of group ``outboxkit.relay.<name>`` and which partitions each one owns;
the outbox knows each partition's backlog; the topic knows when a record last arrived. Every
partition is shown in the shape the relays' own ``/healthz`` uses
(:class:`~outboxkit.relay.engine.PartitionStatus`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka import TopicPartition as KafkaTP

from outboxkit.core import kafka_clients
from outboxkit.core.kafka import admin_client, partition_counts, with_coordinator
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.relay.blocks import plan
from outboxkit.relay.engine import PartitionStatus
from outboxkit.relay.ownership import describe_group
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage

#: Records read back from the end of a partition to find its last data record (transaction
#: markers take offsets too).
_TAIL = 8


@dataclass
class MemberStatus:
    member_id: str
    client_id: str
    host: str
    partitions: list[PartitionStatus] = field(default_factory=list)


@dataclass
class GroupStatus:
    group: str
    #: Kafka's group state: Stable, PreparingRebalance, CompletingRebalance, Empty, Dead.
    state: str
    members: list[MemberStatus] = field(default_factory=list)
    #: Partitions no member owns (no relay running, or a rebalance in progress).
    unowned: list[PartitionStatus] = field(default_factory=list)


async def group_status(settings: RelaySettings, storage: OutboxStorage) -> GroupStatus:
    """The relays of ``settings.relay_name``: members, their partitions, each partition's
    backlog and when a record of it last reached Kafka."""
    counts = await partition_counts(settings, settings.topics)
    tps = [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]
    async with admin_client(settings) as admin:
        state, members = await with_coordinator(
            settings.group_id, lambda: describe_group(admin, settings.group_id)
        )
    backlog, last = await asyncio.gather(storage.backlog(), _last_records(settings, tps))
    statuses = _statuses(tps, backlog, last)
    owned: set[TopicPartition] = set()
    result = GroupStatus(settings.group_id, state)
    for member in members:
        mine = sorted(set(member.assigned) & set(tps), key=lambda tp: (tp.topic, tp.partition))
        owned.update(mine)
        for block in plan(mine, counts, settings.max_block_level):
            for tp in block.partitions(counts[block.topic]):
                statuses[tp].block = str(block)
        result.members.append(
            MemberStatus(
                member.member_id, member.client_id, member.host, [statuses[tp] for tp in mine]
            )
        )
    result.members.sort(key=lambda m: m.member_id)
    result.unowned = [statuses[tp] for tp in tps if tp not in owned]
    return result


async def _last_records(
    kafka: KafkaConnectionSettings, tps: Sequence[TopicPartition]
) -> dict[TopicPartition, float]:
    """Per partition, the timestamp (epoch seconds) of its last record, if any."""
    consumer = kafka_clients.consumer(
        kafka,
        enable_auto_commit=False,
        isolation_level="read_committed",
        client_id="outboxkit-status",
    )
    await consumer.start()
    try:
        ktps = [KafkaTP(tp.topic, tp.partition) for tp in tps]
        consumer.assign(ktps)
        ends = await consumer.end_offsets(ktps)
        starts = await consumer.beginning_offsets(ktps)
        waiting = set()
        for ktp in ktps:
            if ends[ktp] > starts[ktp]:
                consumer.seek(ktp, max(starts[ktp], ends[ktp] - _TAIL))
                waiting.add(ktp)
            else:
                consumer.pause(ktp)
        found: dict[TopicPartition, float] = {}
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                while waiting:
                    batches = await consumer.getmany(timeout_ms=200)
                    for ktp, records in batches.items():
                        for record in records:
                            tp = TopicPartition(ktp.topic, ktp.partition)
                            found[tp] = max(found.get(tp, 0.0), record.timestamp / 1000)
                    for ktp in list(waiting):
                        if await consumer.position(ktp) >= ends[ktp]:
                            waiting.discard(ktp)
                            consumer.pause(ktp)
        return found
    finally:
        await consumer.stop()


def _statuses(
    tps: Sequence[TopicPartition],
    backlog: Sequence[PartitionBacklog],
    last: dict[TopicPartition, float],
) -> dict[TopicPartition, PartitionStatus]:
    now = datetime.now(UTC)
    by_tp = {TopicPartition(b.topic, b.partition): b for b in backlog}
    statuses = {}
    for tp in tps:
        b = by_tp.get(tp)
        published = last.get(tp)
        statuses[tp] = PartitionStatus(
            partition=str(tp),
            block="",
            pending=b.pending if b else 0,
            failed=b.failed if b else 0,
            oldest_pending_age=round(b.age(now.timestamp()), 3) if b and b.pending else 0.0,
            last_publish_at=(
                datetime.fromtimestamp(published, UTC).isoformat() if published else None
            ),
        )
    return statuses
