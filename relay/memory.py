"""An in-memory :class:`~outboxkit.relay.storage.OutboxStorage` for fast engine tests.

It keeps the contract of the real backends (head-of-partition reads, failed records block their
key, wake-ups only for waiting partitions) without a database. Not for production: nothing
survives the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

from outboxkit._version import __version__
from outboxkit.core.memory import MemoryTransaction
from outboxkit.relay.exceptions import UnknownTopicError
from outboxkit.relay.limits import check_size, record_bytes
from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    RecordInfo,
    RecordState,
    TopicPartition,
)
from outboxkit.schemas import Event, check_source, encode, partition_for_key


@dataclass
class _Row:
    record: OutboxRecord
    #: Commit order: the ordering key of this backend (records of a key are read in it).
    seq: int
    event_type: str
    created_at: datetime
    state: RecordState = "pending"
    last_error: str | None = None
    published_at: datetime | None = None


@dataclass
class OutboxTable:
    """The outbox's rows, shared by the storage and the operator's repairs."""

    rows: dict[object, _Row] = field(default_factory=dict)
    next_id: int = 1

    def insert(self, record: OutboxRecord, event_type: str) -> OutboxRecord:
        """``record`` committed now, under the next id (its commit order)."""
        record = replace(record, id=self.next_id)
        self.rows[record.id] = _Row(record, self.next_id, event_type, datetime.now(UTC))
        self.next_id += 1
        return record

    def in_order(self) -> list[_Row]:
        """Every row, in commit order."""
        return sorted(self.rows.values(), key=lambda r: r.seq)


class InMemoryOutboxStorage:
    def __init__(self) -> None:
        #: The rows (:class:`InMemoryOutboxOperations` repairs them).
        self.table = OutboxTable()
        self._topics: dict[str, int] = {}
        self._waiting: set[TopicPartition] = set()
        self._wakeups: asyncio.Queue[TopicPartition | None] = asyncio.Queue()
        #: (group, member id) → whether the announcing process's session is still there. In one
        #: process every session lives as long as the storage; an engine test's subclass ends
        #: one (``SpyStorage.end_session`` in tests/unit/relay_fakes.py), as a relay's death would.
        self._members: dict[tuple[str, str], bool] = {}

    # -- the writer's side (tests) ---------------------------------------------------------

    def add(self, event: Event, *, source: str = "urn:outboxkit:memory") -> OutboxRecord:
        """Write ``event`` as a committed outbox row, as a service would."""
        wire = encode(event, source=source)
        self.check_topic(wire.topic)
        record = OutboxRecord(
            id=None,
            topic=wire.topic,
            partition=partition_for_key(wire.key, self._topics[wire.topic]),
            key=wire.key,
            value=wire.value,
            headers=wire.headers,
            event_id=event.id,
            created_at=datetime.now(UTC),
        )
        record = self.table.insert(record, event.event_type)
        tp = TopicPartition(record.topic, record.partition)
        if tp in self._waiting:
            self._wakeups.put_nowait(tp)
        return record

    def check_topic(self, topic: str) -> None:
        if not self.is_registered(topic):
            raise UnknownTopicError(f"topic {topic!r} is not registered")

    def is_registered(self, topic: str) -> bool:
        """Whether ``topic``'s partition count is known (writers refuse it otherwise)."""
        return topic in self._topics

    @property
    def rows(self) -> list[tuple[OutboxRecord, RecordState]]:
        return [(row.record, row.state) for row in self.table.rows.values()]

    # -- OutboxStorage ----------------------------------------------------------------------

    async def register_topics(self, partitions: Mapping[str, int]) -> None:
        self._topics.update(partitions)

    async def settle_and_claim(
        self,
        tps: Collection[TopicPartition],
        limit: int,
        *,
        published: Sequence[OutboxRecord] = (),
        keep: bool = False,
        depth: int = 1,
        max_bytes: int | None = None,
    ) -> list[OutboxRecord]:
        self._settle(published, keep=keep)
        wanted = set(tps)
        held = {
            (_tp(row.record), row.record.key)
            for row in self.table.rows.values()
            if row.state == "failed" and _tp(row.record) in wanted
        }
        # The oldest ``depth`` records of each key, at most ``limit`` keys per partition, in
        # commit order (like PostgreSQL).
        heads: dict[TopicPartition, dict[bytes, list[OutboxRecord]]] = {tp: {} for tp in wanted}
        found: list[OutboxRecord] = []
        for row in self.table.in_order():
            tp = _tp(row.record)
            if row.state != "pending" or tp not in wanted or (tp, row.record.key) in held:
                continue
            head = heads[tp]
            if row.record.key not in head and len(head) >= limit:
                continue
            of_key = head.setdefault(row.record.key, [])
            if len(of_key) < depth:
                of_key.append(row.record)
                found.append(row.record)
        if max_bytes is None:
            return found
        before: dict[TopicPartition, int] = {}  # bytes of the partition's records before
        bounded = []
        for record in found:
            tp = _tp(record)
            if before.get(tp, 0) < max_bytes:
                bounded.append(record)
                before[tp] = before.get(tp, 0) + record_bytes(record)
        return bounded

    def _settle(self, records: Sequence[OutboxRecord], *, keep: bool) -> None:
        now = datetime.now(UTC)
        for record in records:
            row = self.table.rows.get(record.id)
            if row is None:
                continue
            if keep:
                if row.state == "pending":
                    row.state, row.published_at = "published", now
            else:
                del self.table.rows[record.id]

    async def record_failure(self, record: OutboxRecord, error: str, *, give_up: bool) -> None:
        row = self.table.rows.get(record.id)
        if row is None or row.state != "pending":
            return
        row.record = replace(row.record, attempts=row.record.attempts + 1)
        row.last_error = error
        if give_up:
            row.state = "failed"

    async def set_waiting(self, tps: Collection[TopicPartition], waiting: bool) -> int:
        before = len(self._waiting)
        if waiting:
            self._waiting.update(tps)
        else:
            self._waiting.difference_update(tps)
        return abs(len(self._waiting) - before)

    async def earlier_writers_ended(self, tps: Collection[TopicPartition]) -> bool:
        return True  # writes are atomic here: nothing is ever half-committed

    async def wakeups(self) -> AsyncIterator[TopicPartition | None]:
        while True:
            yield await self._wakeups.get()

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        cutoff = datetime.now(UTC) - older_than
        old = [
            rid
            for rid, row in sorted(self.table.rows.items(), key=lambda item: item[1].seq)
            if row.state == "published" and row.published_at and row.published_at < cutoff
        ][:limit]
        for rid in old:
            del self.table.rows[rid]
        return len(old)

    async def backlog(self) -> list[PartitionBacklog]:
        stats: dict[TopicPartition, PartitionBacklog] = {}
        for row in self.table.rows.values():
            tp = _tp(row.record)
            current = stats.get(tp, PartitionBacklog(tp.topic, tp.partition, 0, None))
            if row.state == "pending":
                oldest = current.oldest_created_at
                current = replace(
                    current,
                    pending=current.pending + 1,
                    oldest_created_at=min(oldest, row.created_at) if oldest else row.created_at,
                )
            elif row.state == "failed":
                current = replace(current, failed=current.failed + 1)
            stats[tp] = current
        return sorted(stats.values(), key=lambda b: (b.topic, b.partition))

    async def announce_member(self, group: str, member_id: str) -> None:
        self._members.setdefault((group, member_id), True)

    async def departed_members(self, group: str, own_member_id: str) -> list[str]:
        return [
            member
            for (g, member), alive in self._members.items()
            if g == group and member != own_member_id and not alive
        ]

    async def forget_members(self, group: str, member_ids: list[str]) -> None:
        for member in member_ids:
            if not self._members.get((group, member), True):
                del self._members[group, member]

    async def member_versions(self, group: str) -> dict[str, str | None]:
        return {member: __version__ for g, member in self._members if g == group}


class InMemoryOutboxOperations:
    """The operator's repairs (:class:`~outboxkit.relay.storage.OutboxOperations`) on an
    :class:`InMemoryOutboxStorage`'s rows."""

    def __init__(self, storage: InMemoryOutboxStorage) -> None:
        self._table = storage.table

    async def list_records(self, state: RecordState, limit: int) -> list[RecordInfo]:
        rows = [r for r in self._table.in_order() if r.state == state]
        return [_info(row) for row in rows[:limit]]

    async def retry_failed(self, event_ids: Sequence[UUID]) -> int:
        count = 0
        for row in self._table.rows.values():
            if row.state == "failed" and row.record.event_id in event_ids:
                row.state, row.last_error = "pending", None
                row.record = replace(row.record, attempts=0)
                count += 1
        return count

    async def skip_failed(self, event_ids: Sequence[UUID]) -> int:
        doomed = [
            rid
            for rid, row in self._table.rows.items()
            if row.state == "failed" and row.record.event_id in event_ids
        ]
        for rid in doomed:
            del self._table.rows[rid]
        return len(doomed)

    async def replay(self, event_ids: Sequence[UUID]) -> int:
        kept = [
            row
            for row in self._table.in_order()
            if row.state == "published" and row.record.event_id in event_ids
        ]
        for row in kept:
            self._table.insert(replace(row.record, attempts=0), row.event_type)
        return len(kept)


def _tp(record: OutboxRecord) -> TopicPartition:
    return TopicPartition(record.topic, record.partition)


def _info(row: _Row) -> RecordInfo:
    r = row.record
    return RecordInfo(
        event_id=r.event_id,
        event_type=row.event_type,
        topic=r.topic,
        partition=r.partition,
        key=r.key,
        state=row.state,
        attempts=r.attempts,
        created_at=row.created_at,
        last_error=row.last_error,
        published_at=row.published_at,
    )


class InMemoryOutbox:
    """The writer API over an :class:`InMemoryOutboxStorage`: events added inside a
    :class:`~outboxkit.core.memory.MemoryTransaction` reach the outbox when it commits."""

    def __init__(self, storage: InMemoryOutboxStorage, *, source: str) -> None:
        self.storage = storage
        self.source = check_source(source)

    async def add(self, tx: MemoryTransaction, event: Event) -> None:
        await self.add_many(tx, [event])

    async def add_many(self, tx: MemoryTransaction, events: Iterable[Event]) -> None:
        added = list(events)
        for event in added:  # fail inside the transaction, as the database writers do
            wire = encode(event, source=self.source)
            check_size(wire, event.id)
            self.storage.check_topic(wire.topic)

        def commit() -> None:
            for event in added:
                self.storage.add(event, source=self.source)

        tx.on_commit(commit)
