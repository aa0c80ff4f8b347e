"""Every database backend, as the contract and guarantee tests use it.

A :class:`BackendCase` is a migrated, empty database of one backend (PostgreSQL, MongoDB, or in
memory) plus what a test needs to look at a handler's effects there. It is the
:class:`~outboxkit.testing.contract.RelayBackend` and
:class:`~outboxkit.testing.contract.InboxBackend` that ``test_contract_*.py`` hand the shipped
contract suites (outboxkit.testing.contract), each case in turn; what a backend does not support
is declared in :attr:`BackendCase.supports` (a skip says so), never left to chance.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pymongo import AsyncMongoClient

from outboxkit.backends import (
    Backend,
    Transactions,
    backend_for,
    forget_memory_database,
    memory_database,
)
from outboxkit.core.memory import MemoryTransaction
from outboxkit.core.mongodb import database_name
from outboxkit.core.settings import ConnectionSettings
from outboxkit.inbox import InboxSettings, InboxStore
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.relay import OutboxOperations, OutboxStorage, RelaySettings, WakeupSource

BACKENDS = ["memory", "postgresql", "mongodb"]

#: What a handler writes in its transaction, and how a test reads back what committed.
WriteEffect = Callable[[Any, str], Awaitable[None]]


@dataclass
class BackendCase:
    name: str
    url: str
    write_effect: WriteEffect
    read_effects: Callable[[], Awaitable[list[str]]]
    supports: set[str] = field(default_factory=set)

    @property
    def backend(self) -> Backend:
        return backend_for(self.url)

    @property
    def settings(self) -> ConnectionSettings:
        return ConnectionSettings(database_url=self.url)

    def require(self, feature: str) -> None:
        if feature not in self.supports:
            pytest.skip(f"{self.name}: declared not to support {feature}")

    # -- the contract suites' RelayBackend and InboxBackend, through outboxkit.backends ------

    @contextlib.asynccontextmanager
    async def relay(
        self, *, retention: timedelta | None = None
    ) -> AsyncIterator[tuple[OutboxStorage, WakeupSource]]:
        settings = RelaySettings(database_url=self.url, topics=["contract"], retention=retention)
        async with self.backend.relay(settings) as parts:
            yield parts

    def operations(self) -> contextlib.AbstractAsyncContextManager[OutboxOperations]:
        return self.backend.outbox_operations(self.settings)

    def transactions(
        self, *, pool_size: int
    ) -> contextlib.AbstractAsyncContextManager[Transactions]:
        return self.backend.transactions(source="urn:test", pool_size=pool_size, connect_timeout=5)

    @contextlib.asynccontextmanager
    async def outside_transaction(self, tx: Transactions) -> AsyncIterator[Any]:
        """A pooled PostgreSQL connection in no transaction; a MongoDB session without one."""
        if self.name == "postgresql":
            async with tx.pool.connection() as conn:  # type: ignore[attr-defined]
                yield conn
        elif self.name == "mongodb":
            async with tx.client.start_session() as session:  # type: ignore[attr-defined]
                yield session
        else:
            raise NotImplementedError(f"{self.name}: every memory transaction is one")

    def inbox_store(
        self, *, retention: timedelta
    ) -> contextlib.AbstractAsyncContextManager[InboxStore[Any]]:
        settings = InboxSettings(
            database_url=self.url, topics=["contract"], inbox_retention=retention
        )
        return self.backend.inbox_store(settings)


async def memory_case() -> AsyncGenerator[BackendCase]:
    url = f"memory://test-{uuid.uuid4().hex[:8]}"

    async def write(tx: MemoryTransaction, value: str) -> None:
        tx.record(value)

    async def read() -> list[str]:
        return [str(e) for e in memory_database(url).inbox.effects]

    try:
        yield BackendCase("memory", url, write, read, supports=set())
    finally:
        forget_memory_database(url)


async def postgresql_case(pg_url: str) -> AsyncGenerator[BackendCase]:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE effects (id serial PRIMARY KEY, value text NOT NULL)")

    async def write(tx: psycopg.AsyncConnection[Any], value: str) -> None:
        await tx.execute("INSERT INTO effects (value) VALUES (%s)", (value,))

    async def read() -> list[str]:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT value FROM effects ORDER BY id")
            return [row[0] for row in await cur.fetchall()]

    yield BackendCase(
        "postgresql", pg_url, write, read, supports={"outside_transaction", "restart", "presence"}
    )


async def mongodb_case(mongo_url: str) -> AsyncGenerator[BackendCase]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = client.get_database(database_name(mongo_url))
    await migrate_mongodb(db)
    await db.create_collection("effects")

    async def write(tx: Any, value: str) -> None:
        await tx.client.get_database(db.name).effects.insert_one({"value": value}, session=tx)

    async def read() -> list[str]:
        return [doc["value"] async for doc in db.effects.find().sort("_id", 1)]

    try:
        yield BackendCase(
            "mongodb",
            mongo_url,
            write,
            read,
            supports={"outside_transaction", "restart", "same_key_commit_order", "presence"},
        )
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def open_case(name: str, url: str) -> AsyncGenerator[BackendCase]:
    """The case ``name`` on a fresh database at ``url`` (none for memory)."""
    if name == "memory":
        cases = memory_case()
    elif name == "postgresql":
        cases = postgresql_case(url)
    else:
        cases = mongodb_case(url)
    case = await anext(cases)
    try:
        yield case
    finally:
        await cases.aclose()
