"""The seam between the relay engine and a database.

The engine never sees SQL or documents: it calls an :class:`OutboxStorage`. PostgreSQL
(:mod:`outboxkit.relay.postgres`) and an in-memory store (:mod:`outboxkit.relay.memory`, for
fast engine tests) implement it; MongoDB will too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    RecordInfo,
    RecordState,
    TopicPartition,
)


class OutboxStorage(Protocol):
    """Everything the relay and the operator commands need from a database."""

    async def register_topics(self, partitions: Mapping[str, int]) -> None:
        """Record each topic's partition count; writers fix a row's partition with it."""

    async def fetch_pending(self, tp: TopicPartition, limit: int) -> list[OutboxRecord]:
        """The oldest pending records of ``tp`` in id order, at most ``limit``, skipping keys
        that a failed record blocks. Reads only: ownership is the caller's Kafka assignment."""

    async def mark_published(self, records: Sequence[OutboxRecord], *, keep: bool) -> None:
        """Delete the published records, or with ``keep`` mark them published (for replay)."""

    async def record_failure(self, record: OutboxRecord, error: str, *, give_up: bool) -> None:
        """Count a failed attempt; with ``give_up`` park the record as failed (blocks its key)."""

    async def set_waiting(self, tp: TopicPartition, waiting: bool) -> None:
        """Declare that a relay waits for new rows of ``tp`` (writers then wake it) or not."""

    async def writers_settled(self, tp: TopicPartition) -> bool:
        """Whether every writer transaction that was open when ``tp``'s relay last declared
        itself waiting has ended. Such a writer may have added its row before the declaration
        was visible to it, and then sent no wake-up; every later writer sees the declaration.
        So once this is true, one more read of ``tp`` misses nothing."""

    def wakeups(self) -> AsyncIterator[TopicPartition | None]:
        """Partitions that got new rows while their relay waited. ``None`` means "may have
        missed some" (the listener reconnected): every partition should look again."""
        ...

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        """Delete at most ``limit`` published records older than ``older_than``; return how many."""

    async def backlog(self) -> list[PartitionBacklog]:
        """Pending and failed counts and the oldest pending record per partition."""

    async def list_records(self, state: RecordState, limit: int) -> list[RecordInfo]:
        """Records in ``state``, oldest first."""

    async def retry_failed(self, event_ids: Sequence[UUID]) -> int:
        """Put failed records back to pending (attempts reset); return how many."""

    async def skip_failed(self, event_ids: Sequence[UUID]) -> int:
        """Delete failed records without publishing them (unblocks their keys)."""

    async def replay(self, event_ids: Sequence[UUID]) -> int:
        """Publish kept (published) records again, after everything pending."""
