"""What the ``outboxkit`` commands share: exit codes, the ``--debug`` flag, loading settings
(a bad one is exit code 2), logging, running a worker until a signal, and opening the outbox
storage or its repairs for one operation."""

from __future__ import annotations

import asyncio
import difflib
import gc
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import ModuleType
from typing import Any, Protocol, TypeVar
from uuid import UUID

import typer
from pydantic_settings import BaseSettings

from outboxkit.backends import Backend, backend_for
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.logs import configure_logging
from outboxkit.core.settings import ConnectionSettings, EventLoop, KafkaSettings, load_settings
from outboxkit.preflight.diagnose import preflight
from outboxkit.probes import serve_probes
from outboxkit.relay import OutboxOperations, OutboxStorage, StorageUnavailableError

T = TypeVar("T")
P = TypeVar("P")
S = TypeVar("S", bound=BaseSettings)

EXIT_FAILED = 1
EXIT_CONFIG = 2

#: Set by ``--debug`` (or ``OUTBOXKIT_LOG_LEVEL=debug``): show tracebacks.
debug = False


def fail_config(exc: ConfigurationError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(EXIT_CONFIG)


def load(cls: type[S], **values: Any) -> S:
    """Load and validate ``cls``; a bad setting ends the command with exit code 2."""
    try:
        return load_settings(cls, **values)
    except ConfigurationError as exc:
        raise fail_config(exc) from None


def configure_worker_logging(log_format: str, log_level: str) -> None:
    level = log_level.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise fail_config(
            ConfigurationError(
                f"OUTBOXKIT_LOG_LEVEL: {log_level!r} is not debug, info, warning or error"
            )
        )
    global debug  # noqa: PLW0603
    debug = debug or level == "DEBUG"
    configure_logging("json" if log_format == "json" else "console", "DEBUG" if debug else level)


class _Health(Protocol):
    @property
    def healthy(self) -> bool: ...


class Worker(Protocol):
    async def run(self) -> None: ...

    def stop(self) -> None: ...

    def health(self) -> _Health: ...


def run_on_loop(main: Coroutine[Any, Any, T], event_loop: EventLoop) -> T:
    """Run ``main`` to its end on a new event loop of the kind a worker's settings name
    (:attr:`~outboxkit.core.settings.WorkerSettings.event_loop`), as :func:`asyncio.run` does."""
    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        return runner.run(main)


def loop_factory(event_loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop`` when asked for (the settings checked that it is installed),
    else ``None``: asyncio's own."""
    if event_loop == "asyncio":
        return None
    import uvloop  # noqa: PLC0415 - optional (the uvloop extra)

    return uvloop.new_event_loop


async def run_worker(worker: Worker, http_port: int | None) -> None:
    """Run a worker until SIGTERM/SIGINT asks it to drain, with its probes if a port is given."""

    def health() -> tuple[bool, object]:
        state = worker.health()
        return state.healthy, state

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    if http_port is not None:
        await serve_probes(http_port, health)
    collect_garbage_rarely()
    await worker.run()


def collect_garbage_rarely() -> None:
    """Keep Python's cyclic garbage collector off a worker's hot path. A relay cycle holds
    thousands of records until Kafka has them, an inbox worker allocates a few dozen objects per
    record: with CPython's defaults they trigger a young-generation collection every 700
    allocations and, every few thousand records, a full one that walks the whole heap, start-up
    objects included. That was about a third of either worker's CPU, for next to no garbage
    (bench/results/relay.md, "Drain with few keys"; docs/inbox.md, "Throughput"). So: freeze
    what the process holds after starting (modules, schemas, pools; never walked again) and collect
    every 50,000 allocations. This process is the worker's own; an app that embeds a relay or
    an inbox decides for itself."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def run_storage(database_url: str | None, action: Callable[[OutboxStorage], Awaitable[T]]) -> T:
    """Run ``action`` on the outbox storage of ``database_url`` (after the database checks)."""
    return _run_on_outbox(database_url, lambda b, settings: b.outbox_storage(settings), action)


def run_operations(
    database_url: str | None, action: Callable[[OutboxOperations], Awaitable[T]]
) -> T:
    """Run ``action`` on the operator's repairs of ``database_url``'s outbox (after the
    database checks)."""
    return _run_on_outbox(database_url, lambda b, settings: b.outbox_operations(settings), action)


def _run_on_outbox(
    database_url: str | None,
    open_part: Callable[[Backend, ConnectionSettings], AbstractAsyncContextManager[P]],
    action: Callable[[P], Awaitable[T]],
) -> T:
    settings = load(ConnectionSettings, database_url=database_url)

    async def run() -> T:
        await preflight(settings, kafka=False)
        async with open_part(backend_for(settings.database_url), settings) as part:
            return await action(part)

    try:
        return asyncio.run(run())
    except StorageUnavailableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


def parse_event_ids(values: list[str]) -> list[UUID]:
    try:
        return [UUID(value) for value in values]
    except ValueError as exc:
        raise fail_config(ConfigurationError(f"not an event id (UUID): {exc}")) from None


def kafka_settings(servers: str | None) -> KafkaSettings:
    """How to reach Kafka: ``--kafka-bootstrap-servers`` when given, the ``OUTBOXKIT_KAFKA_*``
    settings (brokers, TLS, SASL) otherwise."""
    try:
        return load_settings(KafkaSettings, kafka_bootstrap_servers=servers)
    except ConfigurationError as exc:
        raise fail_config(exc) from None


def import_user_module(name: str) -> ModuleType:
    """The user's module ``name`` (where an ``Inbox`` or an ``EventRegistry`` lives). Like
    uvicorn, the current directory's modules import without ``PYTHONPATH``. Raises
    :class:`ConfigurationError` when it cannot be imported."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {name!r}: {exc}") from None


def user_object(target: str, module: ModuleType, attribute: str, kind: type[T], public: str) -> T:
    """``module.attribute`` (``target`` as the user typed it), a ``kind`` (named ``public`` to
    the user); else a :class:`ConfigurationError` saying what is there instead: no such
    attribute (with the closest name, or the module's objects of that kind), or an object of
    another type."""
    if not hasattr(module, attribute):
        names = [name for name in vars(module) if not name.startswith("_")]
        of_kind = sorted(name for name in names if isinstance(getattr(module, name), kind))
        close = difflib.get_close_matches(attribute, of_kind or names, n=1)
        if close:
            hint = f"; did you mean {module.__name__}:{close[0]}?"
        elif of_kind:
            hint = f"; its {kind.__name__} objects: {', '.join(of_kind)}"
        else:
            hint = f"; it has no {kind.__name__}"
        raise ConfigurationError(
            f"{target!r}: module {module.__name__!r} has no attribute {attribute!r}{hint}"
        )
    value = getattr(module, attribute)
    if not isinstance(value, kind):
        raise ConfigurationError(f"{target!r} is not an {public} (it is a {type(value).__name__})")
    return value
