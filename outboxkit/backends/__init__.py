"""Which database a URL names, and what outboxkit runs on it — decided here and nowhere else.

The CLI, the embedded service (FastAPI lifespan), the demo and the testing plugin ask
:func:`backend_for` for what they need; the engines never learn which database they run on::

    backend = backend_for(settings.database_url)
    async with backend.relay(relay_settings) as (storage, wakeups):
        await Relay(relay_settings, storage, wakeups).run()

============  ======================  ========================  ==========================
URL           relay storage            wake-ups                  inbox store / transaction
============  ======================  ========================  ==========================
postgresql:// PostgresOutboxStorage   LISTEN/NOTIFY (same)      PostgresInboxStore / psycopg
                                                                 ``AsyncConnection``
mongodb://    MongoOutboxStorage      change stream             MongoInboxStore / pymongo
                                      (MongoWakeups)            ``AsyncClientSession``
memory://     InMemoryOutboxStorage   in-process (same)         InMemoryInboxStore /
                                                                 ``MemoryTransaction``
============  ======================  ========================  ==========================

``memory://<name>`` is for tests: every user of one name in one process shares one database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psycopg

from outboxkit.check import CheckResult, check_memory, check_mongodb, check_postgresql
from outboxkit.core.memory import MemoryTransaction
from outboxkit.core.mongodb import MongoConnection, collection, in_transaction
from outboxkit.core.postgres import make_pool
from outboxkit.core.settings import ConnectionSettings, DatabaseKind, database_kind
from outboxkit.inbox import InboxSettings, InboxStore, InMemoryInboxStore, MongoInboxStore
from outboxkit.inbox.postgres import PostgresInboxStore
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.postgres import migrate as migrate_postgresql
from outboxkit.relay import (
    InMemoryOutbox,
    InMemoryOutboxOperations,
    InMemoryOutboxStorage,
    MongoOutbox,
    MongoOutboxOperations,
    MongoOutboxStorage,
    MongoWakeups,
    OutboxOperations,
    OutboxStorage,
    OutboxWriter,
    PostgresOutbox,
    PostgresOutboxOperations,
    PostgresOutboxStorage,
    RelaySettings,
    StorageUnavailableError,
    WakeupSource,
)

T = TypeVar("T")

RelayParts = tuple[OutboxStorage, WakeupSource]


class Transactions(Protocol):
    """A service's own transactions and the outbox writer that goes with them."""

    @property
    def outbox(self) -> OutboxWriter[Any]: ...

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A transaction that commits when the block ends without an exception."""

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``work(tx)`` in a transaction, retried from the start when the database asks for it
        (MongoDB's transient write conflicts); committed when it returns."""

    async def registered_topics(self, topics: Collection[str]) -> set[str]:
        """Which of ``topics`` have their partition count in ``outboxkit.topics`` (the writer
        refuses an event of any other: the relay or ``outboxkit topics sync`` records them)."""


class Backend(Protocol):
    kind: DatabaseKind
    url: str

    def relay(self, settings: RelaySettings) -> contextlib.AbstractAsyncContextManager[RelayParts]:
        """The relay's storage and wake-up source, open."""

    def outbox_storage(
        self, settings: ConnectionSettings
    ) -> contextlib.AbstractAsyncContextManager[OutboxStorage]:
        """The outbox for the operator commands that read or change it as the relay does
        (``outboxkit outbox pending``, ``outboxkit topics sync``, ``outboxkit relay status``)."""

    def outbox_operations(
        self, settings: ConnectionSettings
    ) -> contextlib.AbstractAsyncContextManager[OutboxOperations]:
        """The operator's repairs (``outboxkit outbox failed|retry|skip|replay``)."""

    def inbox_store(
        self, settings: InboxSettings
    ) -> contextlib.AbstractAsyncContextManager[InboxStore[Any]]: ...

    def transactions(
        self, *, source: str, pool_size: int, connect_timeout: float
    ) -> contextlib.AbstractAsyncContextManager[Transactions]: ...

    async def migrate(self, connect_timeout: float) -> list[str]:
        """Apply pending migrations; return their labels."""

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]: ...


def backend_for(url: str) -> Backend:
    """The backend of ``url`` (validated by the settings: its scheme is a known one)."""
    kind = database_kind(url)
    if kind == "postgresql":
        return PostgresBackend(url)
    if kind == "mongodb":
        return MongoBackend(url)
    return MemoryBackend(url)


# -- PostgreSQL --------------------------------------------------------------------------------


@dataclass
class _PostgresTransactions:
    pool: Any
    outbox: PostgresOutbox

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        async with self.transaction() as conn:
            return await work(conn)

    async def registered_topics(self, topics: Collection[str]) -> set[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT topic FROM outboxkit.topics WHERE topic = ANY(%s)", (sorted(topics),)
            )
            return {row[0] for row in await cur.fetchall()}


@dataclass
class PostgresBackend:
    url: str
    kind: DatabaseKind = "postgresql"

    @contextlib.asynccontextmanager
    async def relay(self, settings: RelaySettings) -> AsyncIterator[RelayParts]:
        async with PostgresOutboxStorage(
            self.url, pool_size=settings.pool_size, connect_timeout=settings.connect_timeout
        ) as storage:
            yield storage, storage  # LISTEN/NOTIFY lives with the storage's connections

    @contextlib.asynccontextmanager
    async def outbox_storage(self, settings: ConnectionSettings) -> AsyncIterator[OutboxStorage]:
        async with PostgresOutboxStorage(
            self.url, connect_timeout=settings.connect_timeout, application_name="outboxkit-cli"
        ) as storage:
            yield storage

    def outbox_operations(
        self, settings: ConnectionSettings
    ) -> contextlib.AbstractAsyncContextManager[OutboxOperations]:
        return PostgresOutboxOperations(self.url, connect_timeout=settings.connect_timeout)

    @contextlib.asynccontextmanager
    async def inbox_store(self, settings: InboxSettings) -> AsyncIterator[InboxStore[Any]]:
        async with PostgresInboxStore(
            self.url, pool_size=settings.pool_size, connect_timeout=settings.connect_timeout
        ) as store:
            yield store

    @contextlib.asynccontextmanager
    async def transactions(
        self, *, source: str, pool_size: int, connect_timeout: float
    ) -> AsyncIterator[Transactions]:
        pool = make_pool(
            self.url, size=pool_size, connect_timeout=connect_timeout, name="outboxkit-service"
        )
        await pool.open(wait=False)
        try:
            yield _PostgresTransactions(pool, PostgresOutbox(source=source))
        finally:
            await pool.close()

    async def migrate(self, connect_timeout: float) -> list[str]:
        async with await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(connect_timeout)),
            application_name="outboxkit-migrate",
        ) as conn:
            return [m.label for m in await migrate_postgresql(conn)]

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]:
        return await check_postgresql(settings)


# -- MongoDB -----------------------------------------------------------------------------------


@dataclass
class _MongoTransactions:
    client: Any
    outbox: MongoOutbox

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self.client.start_session() as session, await session.start_transaction():
            yield session

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        return await in_transaction(self.client, work, unavailable=StorageUnavailableError)

    async def registered_topics(self, topics: Collection[str]) -> set[str]:
        topics_ = collection(self.client.get_database(self.outbox.database), "topics")
        return {doc["_id"] async for doc in topics_.find({"_id": {"$in": sorted(topics)}})}


@dataclass
class MongoBackend:
    url: str
    kind: DatabaseKind = "mongodb"

    @contextlib.asynccontextmanager
    async def relay(self, settings: RelaySettings) -> AsyncIterator[RelayParts]:
        async with MongoOutboxStorage(
            self.url, connect_timeout=settings.connect_timeout, retention=settings.retention
        ) as storage:
            yield storage, MongoWakeups(storage.outbox)

    @contextlib.asynccontextmanager
    async def outbox_storage(self, settings: ConnectionSettings) -> AsyncIterator[OutboxStorage]:
        async with MongoOutboxStorage(self.url, connect_timeout=settings.connect_timeout) as s:
            yield s

    def outbox_operations(
        self, settings: ConnectionSettings
    ) -> contextlib.AbstractAsyncContextManager[OutboxOperations]:
        return MongoOutboxOperations(self.url, connect_timeout=settings.connect_timeout)

    @contextlib.asynccontextmanager
    async def inbox_store(self, settings: InboxSettings) -> AsyncIterator[InboxStore[Any]]:
        async with MongoInboxStore(
            self.url, connect_timeout=settings.connect_timeout, retention=settings.inbox_retention
        ) as store:
            yield store

    @contextlib.asynccontextmanager
    async def transactions(
        self, *, source: str, pool_size: int, connect_timeout: float
    ) -> AsyncIterator[Transactions]:
        async with MongoConnection(
            self.url, connect_timeout=connect_timeout, app_name="outboxkit-service"
        ) as conn:
            outbox = MongoOutbox(source=source, database=conn.database.name)
            yield _MongoTransactions(conn.client, outbox)

    async def migrate(self, connect_timeout: float) -> list[str]:
        async with MongoConnection(
            self.url, connect_timeout=connect_timeout, app_name="outboxkit-migrate"
        ) as conn:
            return [m.label for m in await migrate_mongodb(conn.database)]

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]:
        return await check_mongodb(settings)


# -- in memory (tests) -------------------------------------------------------------------------


@dataclass
class MemoryDatabase:
    """One ``memory://<name>`` database: what its writers, relays and inboxes share."""

    outbox: InMemoryOutboxStorage = field(default_factory=InMemoryOutboxStorage)
    inbox: InMemoryInboxStore = field(default_factory=InMemoryInboxStore)


_MEMORY: dict[str, MemoryDatabase] = {}


def memory_database(url: str) -> MemoryDatabase:
    """The database ``memory://<name>`` names in this process (made on first use)."""
    return _MEMORY.setdefault(url, MemoryDatabase())


def forget_memory_database(url: str) -> None:
    """Drop ``memory://<name>`` (a test's teardown)."""
    _MEMORY.pop(url, None)


@dataclass
class _MemoryTransactions:
    outbox: InMemoryOutbox
    storage: InMemoryOutboxStorage

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        tx = MemoryTransaction()
        yield tx
        tx.commit()

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        async with self.transaction() as tx:
            return await work(tx)

    async def registered_topics(self, topics: Collection[str]) -> set[str]:
        return {topic for topic in topics if self.storage.is_registered(topic)}


@dataclass
class MemoryBackend:
    url: str
    kind: DatabaseKind = "memory"

    @property
    def database(self) -> MemoryDatabase:
        return memory_database(self.url)

    @contextlib.asynccontextmanager
    async def relay(self, settings: RelaySettings) -> AsyncIterator[RelayParts]:
        yield self.database.outbox, self.database.outbox

    @contextlib.asynccontextmanager
    async def outbox_storage(self, settings: ConnectionSettings) -> AsyncIterator[OutboxStorage]:
        yield self.database.outbox

    @contextlib.asynccontextmanager
    async def outbox_operations(
        self, settings: ConnectionSettings
    ) -> AsyncIterator[OutboxOperations]:
        yield InMemoryOutboxOperations(self.database.outbox)

    @contextlib.asynccontextmanager
    async def inbox_store(self, settings: InboxSettings) -> AsyncIterator[InboxStore[Any]]:
        self.database.inbox.retention = settings.inbox_retention
        yield self.database.inbox

    @contextlib.asynccontextmanager
    async def transactions(
        self, *, source: str, pool_size: int, connect_timeout: float
    ) -> AsyncIterator[Transactions]:
        storage = self.database.outbox
        yield _MemoryTransactions(InMemoryOutbox(storage, source=source), storage)

    async def migrate(self, connect_timeout: float) -> list[str]:
        return []  # nothing to create

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]:
        return await check_memory(settings)
