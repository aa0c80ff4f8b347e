"""outboxkit in memory, for tests: ``memory://<name>`` is one database shared by every writer,
relay and inbox of one process. No driver, nothing durable.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from outboxkit.backends.checks import CheckResult
from outboxkit.core.memory import MemoryTransaction
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings, DatabaseKind
from outboxkit.inbox import InboxSettings, InboxStore, InMemoryInboxStore
from outboxkit.relay import (
    InMemoryOutbox,
    InMemoryOutboxOperations,
    InMemoryOutboxStorage,
    OutboxOperations,
    OutboxStorage,
    RelaySettings,
)

if TYPE_CHECKING:
    from outboxkit.backends import RelayParts, Transactions
    from outboxkit.migrations import Migration

T = TypeVar("T")


# -- the backend -------------------------------------------------------------------------


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

    async def upgrade_plan(
        self, connect_timeout: float
    ) -> tuple[list[Migration], dict[str | None, int]]:
        return [], {}  # nothing to migrate, and no process but this one

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]:
        return [
            CheckResult(
                "database",
                True,
                f"in-memory database {redact(settings.database_url)} (tests only: one process, "
                "not durable)",
            )
        ]

    async def login_problem(self, connect_timeout: float) -> str | None:
        return None  # no login

    def explain(self, exc: BaseException) -> tuple[str, str | None] | None:
        return None  # nothing in memory fails as a driver does
