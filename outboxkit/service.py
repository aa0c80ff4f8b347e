"""outboxkit inside a service: the writer, and the relay and an inbox as supervised tasks.

:class:`Outboxkit` is what a web service embeds. Opened with ``async with`` (or through its
:meth:`~Outboxkit.lifespan`, a Starlette/FastAPI lifespan), it

- opens a connection pool for the service's own transactions and exposes the outbox writer:
  ``async with kit.transaction() as tx: …; await kit.add(tx, event)``;
- optionally runs the relay and an inbox in the background — the very engines the
  ``outboxkit relay`` / ``outboxkit inbox`` workers run, configured by the same settings
  objects (``OUTBOXKIT_*``), validated when the service starts;
- supervises them: a background task that dies turns :meth:`~Outboxkit.health` red, is logged,
  and with ``exit_on_failure=True`` stops the whole process (SIGTERM to itself, which uvicorn
  and gunicorn treat as a graceful shutdown), so the service never keeps accepting writes as
  if events still flowed;
- on exit stops the inbox (commits what its database committed), then the relay (finishes
  in-flight batches), then closes the pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, Self

import psycopg
import structlog
from prometheus_client import REGISTRY, CollectorRegistry
from psycopg.rows import TupleRow

from outboxkit.core.exceptions import ConfigurationError, OutboxkitError
from outboxkit.core.pg import Pool, make_pool
from outboxkit.core.settings import ConnectionSettings, load_settings
from outboxkit.inbox import (
    Inbox,
    InboxHealth,
    InboxMetrics,
    InboxSettings,
    InboxWorker,
    PostgresInboxStore,
)
from outboxkit.relay import (
    PostgresOutbox,
    PostgresOutboxStorage,
    Relay,
    RelayHealth,
    RelayMetrics,
    RelaySettings,
)
from outboxkit.schemas import Event

logger = structlog.get_logger("outboxkit.service")


class ServiceStateError(OutboxkitError):
    """The service was used outside its lifetime: before it opened, or after it closed."""


class _State(Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


@dataclass
class ServiceHealth:
    """Readiness of the embedded components. ``failed`` names background tasks that died."""

    healthy: bool
    state: str
    relay: RelayHealth | None = None
    inbox: InboxHealth | None = None
    failed: dict[str, str] = field(default_factory=dict)


class Outboxkit:
    """The outbox writer plus, optionally, the relay and an inbox, in one service process.

    ``relay=True`` runs the relay with :class:`~outboxkit.relay.RelaySettings` read from the
    environment (or pass the settings object); ``inbox=`` runs that :class:`~outboxkit.inbox.Inbox`
    with :class:`~outboxkit.inbox.InboxSettings` (``inbox_settings=`` or the environment).
    ``settings`` says where the service's own database is (default: the environment)."""

    def __init__(
        self,
        *,
        source: str,
        settings: ConnectionSettings | None = None,
        relay: RelaySettings | bool = False,
        inbox: Inbox | None = None,
        inbox_settings: InboxSettings | None = None,
        pool_size: int = 10,
        exit_on_failure: bool = False,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.outbox = PostgresOutbox(source=source)
        self._settings = settings
        self._relay_option = relay
        self._inbox = inbox
        self._inbox_settings = inbox_settings
        self._pool_size = pool_size
        self._exit_on_failure = exit_on_failure
        self._registry = registry
        self._state = _State.UNOPENED
        self._stack = contextlib.AsyncExitStack()
        self._pool: Pool | None = None
        self._stopping = False
        self.relay: Relay | None = None
        self.inbox_worker: InboxWorker | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, str] = {}
        self._resolved: (
            tuple[RelaySettings | None, InboxSettings | None, ConnectionSettings] | None
        ) = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._state is not _State.UNOPENED:
            raise ServiceStateError(
                f"an Outboxkit service opens once; this one is {self._state.value}"
            )
        relay_settings, inbox_settings, settings = self._resolve_settings()
        try:
            self._pool = make_pool(
                settings.database_url,
                size=self._pool_size,
                connect_timeout=settings.connect_timeout,
                name="outboxkit.service",
            )
            await self._pool.open(wait=False)
            self._stack.push_async_callback(self._pool.close)
            if relay_settings is not None:
                storage = await self._stack.enter_async_context(
                    PostgresOutboxStorage(
                        relay_settings.database_url,
                        pool_size=relay_settings.pool_size,
                        connect_timeout=relay_settings.connect_timeout,
                    )
                )
                metrics = RelayMetrics(self._registry)
                self.relay = Relay(relay_settings, storage, storage, metrics=metrics)
                self._start("relay", self.relay.run())
            if self._inbox is not None and inbox_settings is not None:
                store = await self._stack.enter_async_context(
                    PostgresInboxStore(
                        inbox_settings.database_url,
                        pool_size=inbox_settings.pool_size,
                        connect_timeout=inbox_settings.connect_timeout,
                    )
                )
                worker = InboxWorker(
                    self._inbox, inbox_settings, store, metrics=InboxMetrics(self._registry)
                )
                self.inbox_worker = worker
                self._start("inbox", worker.run())
        except BaseException:
            await self._stop_tasks()
            await self._stack.aclose()
            raise
        self._state = _State.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = _State.CLOSED
        try:
            await self._stop_tasks()
        finally:
            await self._stack.aclose()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[dict[str, Any]]:
        """A Starlette/FastAPI lifespan: ``FastAPI(lifespan=kit.lifespan)``, or nested in your
        own lifespan with ``async with kit.lifespan(app): yield``. The state it yields makes
        the service available as ``request.state.outboxkit``."""
        async with self:
            yield {"outboxkit": self}

    @property
    def database_url(self) -> str:
        """The service's database (validates the settings if that has not happened yet)."""
        return self._resolve_settings()[2].database_url

    def _resolve_settings(
        self,
    ) -> tuple[RelaySettings | None, InboxSettings | None, ConnectionSettings]:
        """Validate every setting before anything starts: a mistake fails the startup."""
        if self._resolved is None:
            self._resolved = self._validate_settings()
        return self._resolved

    def _validate_settings(
        self,
    ) -> tuple[RelaySettings | None, InboxSettings | None, ConnectionSettings]:
        relay: RelaySettings | None = None
        if isinstance(self._relay_option, RelaySettings):
            relay = self._relay_option
        elif self._relay_option:
            relay = load_settings(RelaySettings)
        inbox: InboxSettings | None = None
        if self._inbox is not None:
            # By default an inbox consumes the topics of its handlers' event types.
            inbox = self._inbox_settings or load_settings(InboxSettings, topics=self._inbox.topics)
        settings = self._settings or relay or inbox or load_settings(ConnectionSettings)
        for component in (settings, relay, inbox):
            if component is not None and component.database_kind != "postgresql":
                raise ConfigurationError("the embedded service supports PostgreSQL so far")
        return relay, inbox, settings

    # -- supervision -------------------------------------------------------------------------

    def _start(self, name: str, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work, name=f"outboxkit.{name}")
        task.add_done_callback(lambda t: self._on_done(name, t))
        self._tasks[name] = task

    def _on_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        if task.cancelled():
            error = "cancelled"
        else:
            exc = task.exception()
            error = repr(exc) if exc is not None else "ended unexpectedly"
        self._failed[name] = error
        logger.error(
            "background task died: events no longer flow",
            task=name,
            error=error,
            exit_on_failure=self._exit_on_failure,
        )
        if self._exit_on_failure:
            os.kill(os.getpid(), signal.SIGTERM)

    async def _stop_tasks(self) -> None:
        """The inbox first (it may write outbox events), then the relay; each drains."""
        self._stopping = True
        for name, component in (("inbox", self.inbox_worker), ("relay", self.relay)):
            task = self._tasks.get(name)
            if task is None or component is None:
                continue
            component.stop()
            results = await asyncio.gather(task, return_exceptions=True)
            if isinstance(results[0], BaseException) and name not in self._failed:
                logger.error("background task failed while stopping", task=name, error=results[0])

    @property
    def tasks(self) -> Mapping[str, asyncio.Task[None]]:
        """The background tasks by name (``relay``, ``inbox``), e.g. to watch them."""
        return dict(self._tasks)

    def health(self) -> ServiceHealth:
        relay = self.relay.health() if self.relay is not None else None
        inbox = self.inbox_worker.health() if self.inbox_worker is not None else None
        healthy = (
            self._state is _State.OPEN
            and not self._failed
            and (relay is None or relay.healthy)
            and (inbox is None or inbox.healthy)
        )
        return ServiceHealth(
            healthy=healthy,
            state=self._state.value,
            relay=relay,
            inbox=inbox,
            failed=dict(self._failed),
        )

    @property
    def alive(self) -> bool:
        """False once a background task died: restarting the process is the remedy."""
        return self._state is not _State.CLOSED and not self._failed

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    # -- the writer --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection in a transaction that commits when the block ends without an
        exception (rolls back otherwise). Write your rows and :meth:`add` events in it; commit
        happens before your endpoint returns, so a response never claims an uncommitted write."""
        if self._state is not _State.OPEN or self._pool is None:
            raise ServiceStateError(f"the Outboxkit service is {self._state.value}, not open")
        async with self._pool.connection() as conn, conn.transaction():
            yield conn

    async def add(self, tx: psycopg.AsyncConnection[Any], event: Event) -> None:
        """Add ``event`` to the outbox inside ``tx`` (:meth:`PostgresOutbox.add`)."""
        await self.outbox.add(tx, event)

    async def add_many(self, tx: psycopg.AsyncConnection[Any], events: Iterable[Event]) -> None:
        await self.outbox.add_many(tx, events)
