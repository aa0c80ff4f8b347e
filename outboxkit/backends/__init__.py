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

One module per database (:mod:`.postgres`, :mod:`.mongodb`, :mod:`.memory`), each with its
storage, transactions, migrations, checks and error explanations; :func:`backend_for` imports
the one a URL names on first use, so a process loads only its own database's driver.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from outboxkit.backends.memory import (
    MemoryBackend,
    MemoryDatabase,
    forget_memory_database,
    memory_database,
)
from outboxkit.core.drivers import missing_driver
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.kafka import partition_counts
from outboxkit.core.settings import ConnectionSettings, DatabaseKind, database_kind

if TYPE_CHECKING:
    from outboxkit.backends.checks import CheckResult
    from outboxkit.inbox import InboxSettings, InboxStore
    from outboxkit.migrations import Migration
    from outboxkit.relay import (
        OutboxOperations,
        OutboxStorage,
        OutboxWriter,
        RelaySettings,
        WakeupSource,
    )

__all__ = [
    "Backend",
    "MemoryDatabase",
    "RelayParts",
    "Transactions",
    "backend_for",
    "forget_memory_database",
    "memory_database",
    "sync_topics",
]

T = TypeVar("T")

RelayParts = tuple["OutboxStorage", "WakeupSource"]


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

    async def upgrade_plan(
        self, connect_timeout: float
    ) -> tuple[list[Migration], dict[str | None, int]]:
        """The migrations ``migrate`` would apply, and the outboxkit release of each running
        relay (from its presence; None: a release that recorded none) → how many."""

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]: ...

    async def login_problem(self, connect_timeout: float) -> str | None:
        """Why the server refuses this URL's login, in one line naming the server, the user and
        what to check (a wrong password, an unknown user or database): a mistake no wait fixes.
        ``None`` when it lets the login in, or does not answer within ``connect_timeout`` (an
        outage, which the pools ride out)."""

    def explain(self, exc: BaseException) -> tuple[str, str | None] | None:
        """What a failure of this database's driver means and what to do (naming the server),
        or ``None`` when ``exc`` is not one."""


def backend_for(url: str) -> Backend:
    """The backend of ``url`` (validated by the settings: its scheme is a known one).

    Each backend's module is imported here, on first use: a PostgreSQL service never loads
    pymongo, a MongoDB one never loads psycopg (nor pays for importing it at every start). A
    driver that is not installed is a :class:`ConfigurationError` naming the extra to install
    (:mod:`outboxkit.core.drivers`)."""
    kind = database_kind(url)
    if (missing := missing_driver(kind)) is not None:
        raise ConfigurationError(missing)
    if kind == "postgresql":
        from outboxkit.backends.postgres import PostgresBackend  # noqa: PLC0415 - see above

        return PostgresBackend(url)
    if kind == "mongodb":
        from outboxkit.backends.mongodb import MongoBackend  # noqa: PLC0415 - see above

        return MongoBackend(url)
    return MemoryBackend(url)


async def sync_topics(settings: ConnectionSettings, topics: Collection[str]) -> dict[str, int]:
    """What ``outboxkit topics sync`` does: read each topic's partition count from Kafka and
    record it in the database, so that writers can add events for the topics before a relay
    has started (the relay records them too, once it has joined its group). Returns the counts;
    :class:`ConfigurationError` names the topics Kafka does not have."""
    counts = await partition_counts(settings, list(topics))
    async with backend_for(settings.database_url).outbox_storage(settings) as storage:
        await storage.register_topics(counts)
    return counts
