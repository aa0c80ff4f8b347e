"""Who publishes what, from outside the relays: ``outboxkit relay status``.

Kafka knows the members of group ``outboxkit.relay.<name>`` and which partitions each one owns;
the outbox knows each partition's backlog; the topic knows when a record last arrived. Every
partition is shown in the shape the relays' own ``/healthz`` uses
(:class:`~outboxkit.relay.engine.PartitionStatus`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka import TopicPartition as KafkaTP

from outboxkit.core import kafka_clients
from outboxkit.core.kafka import (
    StatusClients,
    kafka_request_timeout,
    topic_partition_counts,
    with_coordinator,
)
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


class GroupStatusReader(StatusClients):
    """Reads :class:`GroupStatus` through Kafka clients it keeps open: ``outboxkit relay
    status`` opens one for one read (:func:`group_status`), the console keeps one for as long
    as it runs, so that each of its refreshes costs Kafka a few requests and the database one
    backlog read (:meth:`OutboxStorage.backlog`), not new connections."""

    def __init__(self, settings: RelaySettings) -> None:
        super().__init__(
            kafka_clients.admin(
                settings,
                client_id="outboxkit-status",
                request_timeout_ms=int(kafka_request_timeout(settings) * 1000),
            ),
            kafka_clients.consumer(
                settings,
                enable_auto_commit=False,
                isolation_level="read_committed",
                client_id="outboxkit-status",
            ),
        )
        self.settings = settings

    async def partition_counts(self) -> dict[str, int]:
        """Each of the relay's topics' partition count (:class:`ConfigurationError` names the
        missing topics)."""
        return await topic_partition_counts(self._admin, self.settings.topics)

    async def read(
        self,
        storage: OutboxStorage,
        *,
        counts: Mapping[str, int] | None = None,
        last_publish: bool = True,
    ) -> GroupStatus:
        """The relays of ``settings.relay_name``: members, their partitions, each partition's
        backlog and, with ``last_publish``, when a record of it last reached Kafka (a read of
        each partition's tail). ``counts``: the partition counts, when the caller knows them."""
        settings = self.settings
        counts = dict(counts) if counts is not None else await self.partition_counts()
        tps = [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]
        state, members = await with_coordinator(
            settings.group_id, lambda: describe_group(self._admin, settings.group_id)
        )
        if last_publish:
            backlog, last = await asyncio.gather(storage.backlog(), self._last_records(tps))
        else:
            backlog, last = await storage.backlog(), {}
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

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end offset (the last stable one: what ``read_committed`` reaches)."""
        ends = await self._consumer.end_offsets([KafkaTP(tp.topic, tp.partition) for tp in tps])
        return {TopicPartition(k.topic, k.partition): offset for k, offset in ends.items()}

    async def _last_records(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, float]:
        """Per partition, the timestamp (epoch seconds) of its last record, if any."""
        consumer = self._consumer
        ktps = [KafkaTP(tp.topic, tp.partition) for tp in tps]
        consumer.assign(ktps)
        try:
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
            consumer.assign([])


async def group_status(settings: RelaySettings, storage: OutboxStorage) -> GroupStatus:
    """The relays of ``settings.relay_name``: members, their partitions, each partition's
    backlog and when a record of it last reached Kafka (``outboxkit relay status``)."""
    async with GroupStatusReader(settings) as reader:
        return await reader.read(storage)


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
