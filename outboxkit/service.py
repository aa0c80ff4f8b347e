"""outboxkit inside a service: the writer, and the relay and an inbox as supervised tasks.

:class:`Outboxkit` is what a web service embeds. Opened with ``async with`` (or through its
:meth:`~Outboxkit.lifespan`, a Starlette/FastAPI lifespan), it

- opens a connection pool for the service's own transactions and exposes the outbox writer:
  ``async with kit.transaction() as tx: …; await kit.add(tx, event)``;
- refuses to start, with one line naming the server and what to check, when a database refuses
  its login (a wrong password, an unknown user or database): no wait would fix it, and its
  pool would otherwise retry it in the background for ever;
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
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import structlog
from prometheus_client import REGISTRY, CollectorRegistry
from typing_extensions import TypeVar as DefaultTypeVar

from outboxkit.backends import Transactions, backend_for
from outboxkit.core.exceptions import ConfigurationError, OutboxkitError
from outboxkit.core.logs import filter_unconfigured, level_number
from outboxkit.core.settings import ConnectionSettings, load_settings
from outboxkit.core.waiting import sleep_unless_cancelled
from outboxkit.inbox import (
    Inbox,
    InboxHealth,
    InboxMetrics,
    InboxSettings,
    InboxWorker,
)
from outboxkit.relay import (
    Relay,
    RelayHealth,
    RelayMetrics,
    RelaySettings,
)
from outboxkit.schemas import Event, check_source
from outboxkit.variables import unknown_variable_warnings, with_typo_hints

__all__ = ["Outboxkit", "ServiceHealth", "ServiceStateError"]

T = TypeVar("T")

#: The service database's transaction type: a psycopg connection (the default), a pymongo
#: ``AsyncClientSession`` for ``Outboxkit[AsyncClientSession]`` on MongoDB. The default is for
#: type checkers only: at run time a MongoDB service never imports psycopg.
if TYPE_CHECKING:
    import psycopg

    TX = DefaultTypeVar("TX", default=psycopg.AsyncConnection[Any])
else:
    TX = DefaultTypeVar("TX", default=Any)

logger = structlog.get_logger("outboxkit.service")


def _topic_of(written: type[Event] | str) -> str:
    if isinstance(written, str):
        return written
    if written.event_topic is None:
        raise ValueError(
            f"writes: {written.__name__} has no default topic; name the topics its events go to"
        )
    return written.event_topic


async def _refuse_refused_logins(*settings: ConnectionSettings | None) -> None:
    """:class:`ConfigurationError` naming each database (of the service, its relay, its inbox)
    that refuses its login, as the ``outboxkit`` workers refuse to start on one; a database
    that does not answer is left to the pools, which wait for it."""
    timeouts = {s.database_url: s.connect_timeout for s in settings if s is not None}
    problems = await asyncio.gather(
        *(backend_for(url).login_problem(timeout) for url, timeout in timeouts.items())
    )
    refused = [problem for problem in problems if problem is not None]
    if refused:
        raise ConfigurationError("; ".join(refused))


#: The logger through which uvicorn logs a lifespan's failed start-up: the traceback text the
#: application (Starlette) sends with ``lifespan.startup.failed``.
_UVICORN_ERRORS = "uvicorn.error"


def _quiet_server_traceback(exc: OutboxkitError) -> None:
    """Leave out uvicorn's log record of ``exc``'s traceback: its 25 lines (frames of
    Starlette, FastAPI, contextlib and outboxkit) buried the one line that says what to fix
    (``did you mean OUTBOXKIT_DATABASE_URL?``). Kept at OUTBOXKIT_LOG_LEVEL=debug, as the
    ``outboxkit`` commands show a traceback only then. Under another server this filter drops
    nothing: it matches only a traceback of ``exc``, and goes at its first match."""
    if level_number(os.environ.get("OUTBOXKIT_LOG_LEVEL", "info")) <= logging.DEBUG:
        return
    errors = logging.getLogger(_UVICORN_ERRORS)
    text = str(exc)

    def drop(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Traceback (most recent call last)") and text in message:
            errors.removeFilter(drop)
            return False
        return True

    errors.addFilter(drop)


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
    #: Topics of ``Outboxkit(writes=…)`` whose partition counts are not registered yet: a write
    #: of their events would fail (`outboxkit topics sync`, or the relay at its start, fixes it).
    unregistered_topics: list[str] = field(default_factory=list)


class Outboxkit(Generic[TX]):
    """The outbox writer plus, optionally, the relay and an inbox, in one service process.

    The database is the one ``OUTBOXKIT_DATABASE_URL`` names (``postgresql://…``,
    ``mongodb://…``): ``Outboxkit[AsyncClientSession](…)`` types the transactions of a MongoDB
    service for mypy.

    ``relay=True`` runs the relay with :class:`~outboxkit.relay.RelaySettings` read from the
    environment (or pass the settings object); ``inbox=`` runs that :class:`~outboxkit.inbox.Inbox`
    with :class:`~outboxkit.inbox.InboxSettings` (``inbox_settings=`` or the environment).
    ``settings`` says where the service's own database is (default: the environment).

    ``writes`` names what the service writes (event classes, or topics for events whose topic
    is chosen per event): the service is not ready (:meth:`health`, ``/healthz``) until each
    topic's partition count is registered, since a write to it would fail until then."""

    #: Seconds between two looks at the registered topics while some of ``writes`` are not.
    topics_recheck = 2.0

    def __init__(
        self,
        *,
        source: str,
        settings: ConnectionSettings | None = None,
        relay: RelaySettings | bool = False,
        inbox: Inbox[TX] | None = None,
        inbox_settings: InboxSettings | None = None,
        pool_size: int = 10,
        exit_on_failure: bool = False,
        registry: CollectorRegistry = REGISTRY,
        writes: Iterable[type[Event] | str] = (),
    ) -> None:
        check_source(source)  # a URI-reference, as CloudEvents requires (the error says how)
        #: Until registered (readiness); checked by a background task once the service opens.
        self._unregistered = sorted({_topic_of(written) for written in writes})
        self._topics_task: asyncio.Task[None] | None = None
        self.source = source
        self._settings = settings
        self._relay_option = relay
        self._inbox = inbox
        self._inbox_settings = inbox_settings
        self._pool_size = pool_size
        self._exit_on_failure = exit_on_failure
        self._registry = registry
        self._state = _State.UNOPENED
        self._stack = contextlib.AsyncExitStack()
        self._transactions: Transactions | None = None
        self._stopping = False
        self.relay: Relay | None = None
        self.inbox_worker: InboxWorker[TX] | None = None
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
        backend = backend_for(settings.database_url)
        await _refuse_refused_logins(settings, relay_settings, inbox_settings)
        try:
            self._transactions = await self._stack.enter_async_context(
                backend.transactions(
                    source=self.source,
                    pool_size=self._pool_size,
                    connect_timeout=settings.connect_timeout,
                )
            )
            if self._unregistered:
                self._topics_task = asyncio.create_task(
                    self._await_topics(self._transactions), name="outboxkit.topics"
                )
            if relay_settings is not None:
                storage, wakeups = await self._stack.enter_async_context(
                    backend_for(relay_settings.database_url).relay(relay_settings)
                )
                metrics = RelayMetrics(self._registry)
                self.relay = Relay(relay_settings, storage, wakeups, metrics=metrics)
                self._start("relay", self.relay.run())
            if self._inbox is not None and inbox_settings is not None:
                store = await self._stack.enter_async_context(
                    backend_for(inbox_settings.database_url).inbox_store(inbox_settings)
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
        the service available as ``request.state.outboxkit``.

        A start-up that fails as outboxkit expects (invalid settings, a refused login) is logged
        in one line, and the ASGI server's traceback of it left out (see
        :func:`_quiet_server_traceback`); the exception still fails the start-up."""
        try:
            await self.__aenter__()
        except OutboxkitError as exc:
            logger.error(f"the service cannot start: {exc}")
            _quiet_server_traceback(exc)
            raise
        try:
            yield {"outboxkit": self}
        finally:
            await self.__aexit__(None, None, None)

    @property
    def database_url(self) -> str:
        """The service's database (validates the settings if that has not happened yet)."""
        return self._resolve_settings()[2].database_url

    @property
    def settings(self) -> ConnectionSettings:
        """Where the service's database and Kafka are (validated on first use)."""
        return self._resolve_settings()[2]

    @property
    def relay_settings(self) -> RelaySettings | None:
        """The embedded relay's settings; None when the service runs no relay."""
        return self._resolve_settings()[0]

    @property
    def inbox_settings(self) -> InboxSettings | None:
        """The embedded inbox's settings; None when the service runs no inbox."""
        return self._resolve_settings()[1]

    @property
    def inbox(self) -> Inbox[TX] | None:
        """The :class:`~outboxkit.inbox.Inbox` the service runs, if any."""
        return self._inbox

    def on_close(self, close: Callable[[], Awaitable[None]]) -> None:
        """Have ``await close()`` run when the service closes, before its pools: for what an
        app attaches to the service and opens later (the console mounted in it); last in,
        first out. :class:`ServiceStateError` once the service has closed."""
        if self._state is _State.CLOSED:
            raise ServiceStateError("the Outboxkit service is closed")
        self._stack.push_async_callback(close)

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
        filter_unconfigured(os.environ.get("OUTBOXKIT_LOG_LEVEL", "info"))
        for line in unknown_variable_warnings():  # a typo'd variable leaves a default in place
            logger.warning(line)
        try:
            return self._load_settings()
        except ConfigurationError as exc:
            # A required setting under a misspelt name is "not set": say which name it is under.
            raise with_typo_hints(exc) from None

    def _load_settings(
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
        return relay, inbox, settings

    # -- supervision -------------------------------------------------------------------------
    # Not core.supervisor.Supervisor, which raises in the worker that owns its tasks: here the
    # owner is the application's web process, which must go on serving its own requests, so a
    # task that died is reported (health, /livez, the log) and ends the process only with
    # exit_on_failure, as an orchestrator's probe would.

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

    async def _await_topics(self, transactions: Transactions) -> None:
        """Until every topic of ``writes`` is registered, look again every few seconds (a
        deploy step or the relay registers them); then the service may be ready."""
        warned = False
        while True:
            try:
                registered = await transactions.registered_topics(self._unregistered)
            except Exception as exc:  # the database away: the writes would fail too
                logger.debug("cannot read the registered topics", error=repr(exc))
            else:
                self._unregistered = [t for t in self._unregistered if t not in registered]
                if not self._unregistered:
                    return
                if not warned:
                    warned = True
                    logger.warning(
                        "not ready: writes to these topics would fail until their partition "
                        "counts are registered; run `outboxkit topics sync` (or start the relay)",
                        topics=self._unregistered,
                    )
            await sleep_unless_cancelled(self.topics_recheck)

    async def _stop_tasks(self) -> None:
        """The inbox first (it may write outbox events), then the relay; each drains."""
        self._stopping = True
        if self._topics_task is not None:
            self._topics_task.cancel()
            await asyncio.gather(self._topics_task, return_exceptions=True)
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
            and not self._unregistered
            and (relay is None or relay.healthy)
            and (inbox is None or inbox.healthy)
        )
        return ServiceHealth(
            healthy=healthy,
            state=self._state.value,
            relay=relay,
            inbox=inbox,
            failed=dict(self._failed),
            unregistered_topics=list(self._unregistered),
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
    async def transaction(self) -> AsyncIterator[TX]:
        """A transaction of the service's database that commits when the block ends without an
        exception (rolls back otherwise). Write your rows and :meth:`add` events in it; commit
        happens before your endpoint returns, so a response never claims an uncommitted write.

        On MongoDB two transactions that add events of the same key conflict and one of them
        fails with a ``TransientTransactionError``: use :meth:`run_transaction`, which retries."""
        async with self._open().transaction() as tx:
            yield tx

    async def run_transaction(self, work: Callable[[TX], Awaitable[T]]) -> T:
        """``await work(tx)`` in a transaction, retried from the start when the database asks
        for it (MongoDB's transient write conflicts), committed when it returns."""
        return await self._open().run(work)

    async def add(self, tx: TX, event: Event) -> None:
        """Add ``event`` to the outbox inside ``tx``."""
        await self._open().outbox.add(tx, event)

    async def add_many(self, tx: TX, events: Iterable[Event]) -> None:
        await self._open().outbox.add_many(tx, events)

    def _open(self) -> Transactions:
        if self._state is not _State.OPEN or self._transactions is None:
            raise ServiceStateError(f"the Outboxkit service is {self._state.value}, not open")
        return self._transactions
