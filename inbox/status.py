"""``outboxkit inbox status``: where an inbox's partitions stand, read from Kafka alone.

For each partition of the inbox's topics: the committed offset of its consumer group, the end
(last stable offset), what is pending, and the state the worker wrote into the committed
offset's metadata (:mod:`outboxkit.inbox.progress`): when the partition last made progress, its
last error, and whether it is parked. A partition with records pending and no progress for
``stall_after`` seconds is stalled — also when no worker runs at all, or the one that does is
hung, since then nobody refreshes that state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupIdNotFound, for_code

from outboxkit.core import kafka_clients
from outboxkit.core.kafka import (
    StatusClients,
    partition_counts,
    topic_partition_counts,
    with_coordinator,
)
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.inbox.progress import is_stalled, read_metadata


@dataclass(frozen=True)
class PartitionStatus:
    partition: str
    #: The next offset the group will handle (``None``: it never committed one).
    offset: int | None
    end: int
    pending: int
    seconds_since_progress: float | None
    last_error: str | None
    parked: str | None
    stalled: bool

    @property
    def ok(self) -> bool:
        return not (self.stalled or self.parked)


@dataclass(frozen=True)
class InboxStatus:
    group: str
    #: Workers in the consumer group right now.
    members: int
    partitions: list[PartitionStatus]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions)


class InboxStatusReader(StatusClients):
    """Reads :class:`InboxStatus` through Kafka clients it keeps open: ``outboxkit inbox
    status`` opens one for one read (:func:`read_status`), the console keeps one for as long as
    it runs (a few Kafka requests per read, no new connections)."""

    def __init__(self, kafka: KafkaConnectionSettings) -> None:
        super().__init__(
            kafka_clients.admin(kafka, client_id="outboxkit"),
            kafka_clients.consumer(
                kafka,
                isolation_level="read_committed",  # the end a worker can reach
                client_id="outboxkit.status",
            ),
        )

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        return await topic_partition_counts(self._admin, topics)

    async def read(
        self,
        group: str,
        topics: Sequence[str],
        *,
        stall_after: float,
        counts: Mapping[str, int] | None = None,
    ) -> InboxStatus:
        """The status of consumer group ``group`` on ``topics`` (see the module). ``counts``:
        the topics' partition counts, when the caller knows them."""
        counts = dict(counts) if counts is not None else await self.partition_counts(topics)
        tps = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
        admin = self._admin
        committed = await with_coordinator(
            group, lambda: admin.list_consumer_group_offsets(group, partitions=tps)
        )
        members = await with_coordinator(group, lambda: _members(admin, group))
        ends = await self._consumer.end_offsets(tps)
        return _status(
            group, members, tps=tps, committed=committed, ends=ends, stall_after=stall_after
        )


async def read_status(
    kafka: KafkaConnectionSettings, group: str, topics: Sequence[str], *, stall_after: float
) -> InboxStatus:
    """The status of consumer group ``group`` on ``topics`` (see the module)."""
    counts = await partition_counts(kafka, topics)
    async with InboxStatusReader(kafka) as reader:
        return await reader.read(group, topics, stall_after=stall_after, counts=counts)


def _status(
    group: str,
    members: int,
    *,
    tps: Sequence[TopicPartition],
    committed: Mapping[TopicPartition, Any],
    ends: Mapping[TopicPartition, int],
    stall_after: float,
) -> InboxStatus:
    now = time.time()
    partitions = []
    for tp in tps:
        mark = committed.get(tp)
        offset = mark.offset if mark is not None and mark.offset >= 0 else None
        state = read_metadata(mark.metadata if mark is not None else None)
        progress_at = state.get("progress_at")
        progress_at = float(progress_at) if isinstance(progress_at, int | float) else None
        pending = max(ends[tp] - (offset or 0), 0)
        parked = state.get("parked")
        partitions.append(
            PartitionStatus(
                partition=f"{tp.topic}/{tp.partition}",
                offset=offset,
                end=ends[tp],
                pending=pending,
                seconds_since_progress=None if progress_at is None else round(now - progress_at, 1),
                last_error=state.get("error"),
                parked=parked,
                stalled=parked is None and is_stalled(pending, progress_at, stall_after, now),
            )
        )
    return InboxStatus(group=group, members=members, partitions=partitions)


async def _members(admin: AIOKafkaAdminClient, group: str) -> int:
    """How many members ``group`` has (aiokafka returns the raw DescribeGroups response:
    ``(error_code, group_id, state, protocol_type, protocol, members, …)`` per group)."""
    [described] = await admin.describe_consumer_groups([group])
    groups = getattr(described, "groups", None) or [()]
    code = groups[0][0] if groups[0] else 0
    if code == GroupIdNotFound.errno:  # newer brokers: a group nobody joined yet
        return 0
    if code:  # e.g. the coordinator is still loading the group after a restart
        raise for_code(code)()
    members = groups[0][5] if len(groups[0]) > 5 else []
    return len(members) if isinstance(members, list) else 0
