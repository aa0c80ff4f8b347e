"""The seams between the relay engine and a database.

The engine never sees SQL or documents: it reads and updates records through an
:class:`OutboxStorage`, and learns that new records were committed from a :class:`WakeupSource`
(hints only: the storage is the truth). The operator's repairs are a third seam,
:class:`OutboxOperations`, that the engine never uses. PostgreSQL
(:mod:`outboxkit.relay.postgres`), MongoDB (:mod:`outboxkit.relay.mongodb`) and an in-memory
backend (:mod:`outboxkit.relay.memory`, for fast engine tests) implement all three.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Protocol, TypeVar
from uuid import UUID

from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    RecordInfo,
    RecordState,
    TopicPartition,
)
from outboxkit.schemas import Event

TX_contra = TypeVar("TX_contra", contravariant=True)


class OutboxWriter(Protocol[TX_contra]):
    """The service side: adds events inside the caller's open transaction of type ``TX`` (a
    psycopg connection, a pymongo session, a memory transaction). Nothing is committed here."""

    async def add(self, tx: TX_contra, event: Event) -> None: ...

    async def add_many(self, tx: TX_contra, events: Iterable[Event]) -> None: ...


class OutboxStorage(Protocol):
    """The records as the relay reads and changes them (the operator's commands ``outboxkit
    outbox pending`` and ``outboxkit topics sync`` use :meth:`backlog` and
    :meth:`register_topics` too)."""

    async def register_topics(self, partitions: Mapping[str, int]) -> None:
        """Record each topic's partition count; writers fix a row's partition with it."""

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
        """Settle ``published``, then read the heads of ``tps``. One call per relay cycle.

        1. ``published`` are records Kafka has accepted: delete them, or with ``keep`` mark them
           published (for replay). This is durable before the call returns: the relay then
           publishes their keys' next records, and a crash must not bring an older record
           back after a newer one (G2).
        2. For each partition in ``tps``, return its oldest pending records in commit order, of
           at most ``limit`` keys per partition, skipping keys that a failed record blocks, and
           never a record of ``published``. Of each key, its oldest record, and up to ``depth``
           of its oldest records in order **with none skipped**: the engine publishes them one
           per key per Kafka transaction, settling each before the next. A storage may return
           fewer (one per key is always correct).
        3. With ``max_bytes``, of each partition's records so chosen, in commit order (or key by
           key, oldest key first), only those while the bytes of the ones before them
           (:func:`~outboxkit.relay.limits.record_bytes`) stay under ``max_bytes``: always the
           first, and a partition cut short this way returns at least ``max_bytes`` (so the
           caller can tell it has more). A key still gets a prefix of its records.

        Reads only: ownership is the caller's Kafka assignment. ``tps`` may be empty (settle
        only)."""

    async def record_failure(self, record: OutboxRecord, error: str, *, give_up: bool) -> None:
        """Count a failed attempt; with ``give_up`` park the record as failed (it holds its key)."""

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        """Delete at most ``limit`` published records older than ``older_than``; return how many."""

    async def backlog(self) -> list[PartitionBacklog]:
        """Pending and failed counts and the oldest pending record per partition."""

    async def announce_member(self, group: str, member_id: str) -> None:
        """This process is ``member_id`` of consumer group ``group`` from now on (the relay
        announces its process key, :attr:`Ownership.process_key`), replacing what it announced
        before, for as long as it keeps its database session. Called again at every check (it
        also makes sure that session is still there)."""

    async def departed_members(self, group: str, own_member_id: str) -> list[str]:
        """Members of ``group`` announced by a process whose database session has ended since
        (it died, or lost the database): the relay asks Kafka to remove them at once rather
        than at their session timeout. Each is returned at every call until
        :meth:`forget_members` is told of it, so a departure found while Kafka cannot be told
        (the broker is down) is acted on when it is back. None when the storage cannot tell
        for sure (:mod:`outboxkit.relay.presence`): a wrong answer costs a rebalance."""

    async def forget_members(self, group: str, member_ids: list[str]) -> None:
        """Stop reporting ``member_ids`` of ``group``: Kafka's group no longer has them. One
        that announced itself again since (it had only lost the database) is kept."""

    async def member_versions(self, group: str) -> dict[str, str | None]:
        """The members of ``group`` announced here (their process keys, the Kafka client ids)
        → the outboxkit release each runs (None: a release that recorded none). The console
        shows it beside each partition's owner."""


class OutboxOperations(Protocol):
    """The operator's repairs (``outboxkit outbox failed|retry|skip|replay``): the relay never
    calls them, so a backend implements them apart from its :class:`OutboxStorage`. Each keeps
    per-key order: a retried record is still its key's oldest, a replayed one goes after
    everything pending of its key."""

    async def list_records(self, state: RecordState, limit: int) -> list[RecordInfo]:
        """Records in ``state``, oldest first."""

    async def retry_failed(self, event_ids: Sequence[UUID]) -> int:
        """Put failed records back to pending (attempts reset); return how many."""

    async def skip_failed(self, event_ids: Sequence[UUID]) -> int:
        """Delete failed records without publishing them (releases their keys)."""

    async def replay(self, event_ids: Sequence[UUID]) -> int:
        """Publish kept (published) records again, after everything pending."""


class WakeupSource(Protocol):
    """Wake-ups on commit (guarantee G5). A hint, never the truth: the relay reads the storage
    again on every wake-up, after every reconnect and at each sweep interval.

    PostgreSQL sends a notification only to relays that declared themselves idle, so that busy
    relays cost writers nothing; a change stream costs writers nothing anyway, so there
    :meth:`set_waiting` does nothing and :meth:`earlier_writers_ended` is always true."""

    async def set_waiting(self, tps: Collection[TopicPartition], waiting: bool) -> int:
        """Declare that a relay waits for new rows of ``tps`` (writers then wake it) or not;
        return how many of ``tps`` this changed. The relay declares again what it believes
        declared (at each sweep, after a reconnect): a partition whose declaration the storage
        no longer had counts, and tells the relay that writers have not been waking it. A
        storage with nothing to declare returns 0."""

    async def earlier_writers_ended(self, tps: Collection[TopicPartition]) -> bool:
        """Whether every writer transaction that was open when ``tps``' relay last declared
        itself waiting has ended. Such a writer may have added its row before the declaration
        was visible to it, and then sent no wake-up; every later writer sees the declaration.
        So once this is true, one more read of ``tps`` misses nothing."""

    def wakeups(self) -> AsyncIterator[TopicPartition | None]:
        """Partitions that got new rows while their relay waited. ``None`` means "may have
        missed some" (the listener reconnected): every partition should look again."""
        ...
