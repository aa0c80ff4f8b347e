"""The ``outboxkit`` command.

Exit codes: 0 success; 1 a check or operation failed; 2 invalid configuration or usage.
Options that say where things are or how a worker runs have an ``OUTBOXKIT_*`` environment
variable twin, shown in ``--help``; per-invocation flags (``--json``, ``--limit``…) do not
(:mod:`outboxkit.cli_options`). Expected failures end the command with one or two lines on
stderr (:mod:`outboxkit.diagnose`); ``--debug`` or ``OUTBOXKIT_LOG_LEVEL=debug`` shows the
traceback too.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol, TypeVar
from uuid import UUID

import psycopg
import typer
from aiokafka.errors import KafkaError
from pydantic_settings import BaseSettings
from pymongo.errors import PyMongoError
from rich.progress import Progress

from outboxkit import topics_cli
from outboxkit._version import __version__
from outboxkit.backends import backend_for
from outboxkit.check import explain_database_error, redact, run_checks
from outboxkit.cli_options import (
    BootstrapServers,
    DatabaseUrl,
    DlqSuffix,
    JsonOutput,
    Limit,
    Topics,
)
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.kafka import partition_counts
from outboxkit.core.logs import configure_logging
from outboxkit.core.settings import ConnectionSettings, load_settings
from outboxkit.demo.cli import demo
from outboxkit.dev_cli import dev_app
from outboxkit.diagnose import explain, preflight
from outboxkit.inbox import (
    DeadLetter,
    DeadLetterError,
    Inbox,
    InboxSettings,
    InboxWorker,
    read_dead_letters,
    replay_dead_letters,
    unique_dead_letters,
)
from outboxkit.inbox.status import read_status
from outboxkit.migrations import MigrationError, load_migrations, script
from outboxkit.pipeline.cli import pipeline_app
from outboxkit.probes import serve_probes
from outboxkit.relay import (
    OutboxStorage,
    PartitionStatus,
    Relay,
    RelaySettings,
    StorageUnavailableError,
    group_status,
)

T = TypeVar("T")
S = TypeVar("S", bound=BaseSettings)

EXIT_FAILED = 1
EXIT_CONFIG = 2

app = typer.Typer(
    name="outboxkit",
    help="Transactional outbox and inbox: write to your database and publish to Kafka, safely.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help text: wrapped to the terminal, no boxes, no <bool> after flags.
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)

#: Set by ``--debug`` (or ``OUTBOXKIT_LOG_LEVEL=debug``): show tracebacks.
_debug = False


def _version(value: bool) -> None:
    if value:
        typer.echo(f"outboxkit {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show the traceback of a failure (as OUTBOXKIT_LOG_LEVEL=debug does), and "
            "debug logs.",
        ),
    ] = False,
) -> None:
    """Transactional outbox and inbox: write to your database and publish to Kafka, safely."""
    global _debug  # noqa: PLW0603
    _debug = _debug or debug


def _fail_config(exc: ConfigurationError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(EXIT_CONFIG)


def _settings(cls: type[S], **values: Any) -> S:
    """Load and validate ``cls``; a bad setting ends the command with exit code 2."""
    try:
        return load_settings(cls, **values)
    except ConfigurationError as exc:
        raise _fail_config(exc) from None


@app.command()
def check(
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    json_output: JsonOutput = False,
) -> None:
    """Connect to the database and the broker and say what is wrong, if anything."""
    settings = _settings(
        ConnectionSettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
    )
    # The checks report connection failures themselves; aiokafka would also log them.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    backend = backend_for(settings.database_url)
    results = asyncio.run(run_checks(settings, backend.check(settings)))
    if json_output:
        typer.echo(json.dumps([asdict(r) for r in results], indent=2))
    else:
        for r in results:
            typer.echo(f"{'ok  ' if r.ok else 'FAIL'} {r.name:<11} {r.summary}")
            if r.fix:
                typer.echo(f"     {'':<11} → {r.fix}")
    if not all(r.ok for r in results):
        raise typer.Exit(EXIT_FAILED)


@app.command("migrate")
def migrate_command(
    database_url: DatabaseUrl = None,
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL instead of applying it (for Alembic & co).")
    ] = False,
) -> None:
    """Create or upgrade outboxkit's tables (PostgreSQL) or collections and indexes (MongoDB).
    Safe to run again and concurrently."""
    if sql:
        typer.echo(script(load_migrations()), nl=False)
        return
    settings = _settings(ConnectionSettings, database_url=database_url)
    backend = backend_for(settings.database_url)
    try:
        applied = asyncio.run(backend.migrate(settings.connect_timeout))
    except psycopg.Error as exc:
        what, fix = explain_database_error(exc, redact(settings.database_url))
        typer.echo(f"error: migrating failed: {what}", err=True)
        if fix:
            typer.echo(f"  → {fix}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except (PyMongoError, MigrationError) as exc:
        typer.echo(f"error: migrating {redact(settings.database_url)} failed: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if applied:
        typer.echo("applied " + ", ".join(applied))
    else:
        typer.echo("schema is up to date")


LogFormatOption = Annotated[
    str,
    typer.Option(envvar="OUTBOXKIT_LOG_FORMAT", metavar="console|json", help="Log format."),
]
LogLevelOption = Annotated[
    str,
    typer.Option(
        envvar="OUTBOXKIT_LOG_LEVEL",
        metavar="debug|info|warning|error",
        help="Log level; debug also shows the traceback of a failure.",
    ),
]
HttpPort = Annotated[
    int | None,
    typer.Option(
        envvar="OUTBOXKIT_HTTP_PORT",
        metavar="PORT",
        help="Serve /healthz and /metrics (Prometheus) on this port.",
    ),
]


def _configure_logging(log_format: str, log_level: str) -> None:
    level = log_level.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise _fail_config(
            ConfigurationError(
                f"OUTBOXKIT_LOG_LEVEL: {log_level!r} is not debug, info, warning or error"
            )
        )
    global _debug  # noqa: PLW0603
    _debug = _debug or level == "DEBUG"
    configure_logging("json" if log_format == "json" else "console", "DEBUG" if _debug else level)


RelayName = Annotated[
    str | None,
    typer.Option(
        envvar="OUTBOXKIT_RELAY_NAME",
        metavar="NAME",
        help="Relay name: group outboxkit.relay.<name>.",
    ),
]

relay_app = typer.Typer(
    help="Run a relay worker (outboxkit relay), or show who publishes what (outboxkit relay "
    "status).",
)
app.add_typer(relay_app, name="relay")


@relay_app.callback(invoke_without_command=True)
def relay(
    ctx: typer.Context,
    *,
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    relay_name: RelayName = None,
    http_port: HttpPort = None,
    log_format: LogFormatOption = "console",
    log_level: LogLevelOption = "info",
) -> None:
    """Publish the outbox to Kafka until SIGTERM/SIGINT, then drain and leave the group.
    Refuses to start when the database, outboxkit's tables, the broker or a topic is missing."""
    if ctx.invoked_subcommand is not None:
        return
    _configure_logging(log_format, log_level)
    settings = _settings(
        RelaySettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
        relay_name=relay_name,
    )
    asyncio.run(preflight(settings, topics=settings.topics))

    async def run() -> None:
        async with backend_for(settings.database_url).relay(settings) as (storage, wakeups):
            await _run_worker(Relay(settings, storage, wakeups), http_port)

    asyncio.run(run())


@relay_app.command("status")
def relay_status(
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    relay_name: RelayName = None,
    json_output: JsonOutput = False,
) -> None:
    """Each relay of the group (member id, client, host), the partitions it owns, and per
    partition its backlog, oldest pending age and last publish time (from Kafka)."""
    settings = _settings(
        RelaySettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
        relay_name=relay_name,
    )
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        status = _run_storage(settings.database_url, lambda s: group_status(settings, s))
    except (ConfigurationError, KafkaError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if json_output:
        typer.echo(json.dumps(asdict(status), indent=2))
        return
    typer.echo(f"group {status.group}: {status.state}, {len(status.members)} member(s)")
    for member in status.members:
        typer.echo(f"member {member.member_id} (client {member.client_id}, host {member.host})")
        for p in member.partitions:
            typer.echo("  " + _describe_partition(p))
    if status.unowned:
        typer.echo("owned by no relay:")
        for p in status.unowned:
            typer.echo("  " + _describe_partition(p))


def _describe_partition(p: PartitionStatus) -> str:
    age = f"{p.oldest_pending_age:.1f} s" if p.pending else "-"
    last = p.last_publish_at or "never"
    block = f" (block {p.block})" if p.block else ""
    return (
        f"{p.partition}{block}: {p.pending} pending (oldest {age}), {p.failed} failed, "
        f"last publish {last}"
    )


inbox_app = typer.Typer(
    help="Run an inbox worker (outboxkit inbox module:inbox), or inspect and replay its "
    "dead-letter topics (outboxkit inbox dlq …).",
    no_args_is_help=True,
)
app.add_typer(inbox_app, name="inbox")


@inbox_app.command("run")
def inbox_command(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:INBOX",
            help="Your Inbox object as module:attribute, e.g. payments.events:inbox",
        ),
    ],
    *,
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    http_port: HttpPort = None,
    log_format: LogFormatOption = "console",
    log_level: LogLevelOption = "info",
) -> None:
    """Consume events and run the handlers of an Inbox until SIGTERM/SIGINT, then commit and
    leave the group. Without --topics, the topics of the handlers' event types. Refuses to
    start when the database, outboxkit's tables, the broker, a topic or its dead-letter topic
    is missing."""
    _configure_logging(log_format, log_level)
    try:
        inbox = _import_inbox(target)
    except ConfigurationError as exc:
        raise _fail_config(exc) from None
    settings = _settings(
        InboxSettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics or ",".join(inbox.topics) or None,
    )
    dlqs = [f"{topic}{settings.dlq_suffix}" for topic in settings.topics]
    asyncio.run(preflight(settings, topics=[*settings.topics, *dlqs]))

    async def run() -> None:
        async with backend_for(settings.database_url).inbox_store(settings) as store:
            worker = InboxWorker(inbox, settings, store)
            _collect_garbage_rarely()
            await _run_worker(worker, http_port)

    asyncio.run(run())


def _collect_garbage_rarely() -> None:
    """Keep Python's cyclic garbage collector off an inbox worker's hot path. The worker
    allocates a few dozen short-lived objects per record, which trigger a young-generation
    collection every 700 allocations and a full one every few thousand records — about a third
    of the worker's CPU, for next to no garbage (docs/inbox.md, "Throughput"). Freeze what the
    process holds after starting (modules, schemas, pools), and collect every 50,000
    allocations instead. This process is the worker's own; an app that embeds an inbox decides
    for itself."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class _Health(Protocol):
    @property
    def healthy(self) -> bool: ...


class _Worker(Protocol):
    async def run(self) -> None: ...

    def stop(self) -> None: ...

    def health(self) -> _Health: ...


async def _run_worker(worker: _Worker, http_port: int | None) -> None:
    """Run a worker until SIGTERM/SIGINT asks it to drain, with its probes if a port is given."""

    def health() -> tuple[bool, object]:
        state = worker.health()
        return state.healthy, state

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    if http_port is not None:
        await serve_probes(http_port, health)
    await worker.run()


def _import_inbox(target: str) -> Inbox[Any]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{target!r}: give the Inbox as module:attribute")
    # Like uvicorn: modules of the current directory import without PYTHONPATH.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
    inbox = getattr(module, attribute, None)
    if not isinstance(inbox, Inbox):
        raise ConfigurationError(f"{target!r} is not an outboxkit.inbox.Inbox (got {inbox!r})")
    return inbox


app.command("demo")(demo)
app.add_typer(pipeline_app, name="pipeline")

outbox_app = typer.Typer(
    help="Inspect and repair the outbox: pending backlog, failed records, retry, skip, replay.",
    no_args_is_help=True,
)
app.add_typer(outbox_app, name="outbox")

EventIds = Annotated[list[str], typer.Argument(metavar="EVENT_ID", help="Event ids (UUIDs).")]


def _event_ids(values: list[str]) -> list[UUID]:
    try:
        return [UUID(value) for value in values]
    except ValueError as exc:
        raise _fail_config(ConfigurationError(f"not an event id (UUID): {exc}")) from None


def _run_storage(database_url: str | None, action: Callable[[OutboxStorage], Awaitable[T]]) -> T:
    settings = _settings(ConnectionSettings, database_url=database_url)

    async def run() -> T:
        await preflight(settings, kafka=False)
        async with backend_for(settings.database_url).outbox_storage(settings) as storage:
            return await action(storage)

    try:
        return asyncio.run(run())
    except StorageUnavailableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


@outbox_app.command("pending")
def outbox_pending(database_url: DatabaseUrl = None, json_output: JsonOutput = False) -> None:
    """Pending and failed records per partition, and the age of the oldest pending one."""
    backlog = _run_storage(database_url, lambda s: s.backlog())
    if json_output:
        typer.echo(json.dumps([asdict(b) for b in backlog], default=str, indent=2))
        return
    if not backlog:
        typer.echo("nothing pending")
    now = datetime.now(UTC)
    for b in backlog:
        age = f"{(now - b.oldest_created_at).total_seconds():.1f} s" if b.oldest_created_at else "-"
        typer.echo(
            f"{b.topic}/{b.partition}: {b.pending} pending (oldest {age}), {b.failed} failed"
        )


@outbox_app.command("failed")
def outbox_failed(
    database_url: DatabaseUrl = None, limit: Limit = 100, json_output: JsonOutput = False
) -> None:
    """Records the broker refused (parked after retries), with their errors."""
    records = _run_storage(database_url, lambda s: s.list_records("failed", limit))
    if json_output:
        typer.echo(json.dumps([asdict(r) for r in records], default=str, indent=2))
        return
    if not records:
        typer.echo("no failed records")
    for r in records:
        typer.echo(
            f"{r.event_id} {r.event_type} {r.topic}/{r.partition} key={r.key!r} "
            f"attempts={r.attempts}: {r.last_error}"
        )


def _repair(
    database_url: str | None, ids: list[UUID], verb: str, method: str, json_output: bool
) -> None:
    count = _run_storage(database_url, lambda s: getattr(s, method)(ids))
    if count == 0:
        typer.echo(f"error: no matching record for {', '.join(map(str, ids))}", err=True)
        raise typer.Exit(EXIT_FAILED)
    if json_output:
        typer.echo(json.dumps({"action": method, "records": count}))
    else:
        typer.echo(f"{verb} {count} record(s)")


@outbox_app.command("retry")
def outbox_retry(
    event_ids: EventIds, database_url: DatabaseUrl = None, json_output: JsonOutput = False
) -> None:
    """Put failed records back in line (their key stays blocked until they are published)."""
    _repair(database_url, _event_ids(event_ids), "retrying", "retry_failed", json_output)


@outbox_app.command("skip")
def outbox_skip(
    event_ids: EventIds, database_url: DatabaseUrl = None, json_output: JsonOutput = False
) -> None:
    """Drop failed records without publishing them; their keys flow again."""
    _repair(database_url, _event_ids(event_ids), "skipped", "skip_failed", json_output)


@outbox_app.command("replay")
def outbox_replay(
    event_ids: EventIds, database_url: DatabaseUrl = None, json_output: JsonOutput = False
) -> None:
    """Publish kept (published) records again, after everything pending. Needs a retention
    (OUTBOXKIT_RETENTION) so that published records are kept."""
    _repair(database_url, _event_ids(event_ids), "replaying", "replay", json_output)


dlq_app = typer.Typer(
    help="Dead-letter topics (<topic><suffix>): list what the inbox dead-lettered, replay it.",
    no_args_is_help=True,
)
inbox_app.add_typer(dlq_app, name="dlq")


def _dlq_topics(topics: str | None, suffix: str) -> list[str]:
    names = [t.strip() for t in (topics or "").split(",") if t.strip()]
    if not names:
        raise _fail_config(
            ConfigurationError("OUTBOXKIT_TOPICS is not set: give the inbox's topics (--topics)")
        )
    return [name if name.endswith(suffix) else f"{name}{suffix}" for name in names]


def _bootstrap(servers: str | None) -> list[str]:
    return [s.strip() for s in (servers or "localhost:9092").split(",") if s.strip()]


def _read_dlq(servers: str | None, topics: list[str], limit: int | None) -> list[DeadLetter]:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(read_dead_letters(_bootstrap(servers), topics, limit=limit))
    except DeadLetterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


@dlq_app.command("list")
def dlq_list(
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    dlq_suffix: DlqSuffix = ".dlq",
    limit: Limit = 100,
    json_output: JsonOutput = False,
) -> None:
    """Dead-lettered records with their reason, error and source position, oldest first."""
    letters = _read_dlq(kafka_bootstrap_servers, _dlq_topics(topics, dlq_suffix), limit)
    if json_output:
        typer.echo(json.dumps([d.summary() for d in letters], indent=2))
        return
    if not letters:
        typer.echo("no dead-lettered records")
    first = {id(d) for d in unique_dead_letters(letters)}
    for d in letters:
        info = d.summary()
        # Dead-lettering is at least once: a later copy of the same one is marked as such.
        copy = "" if id(d) in first else " (a copy of an earlier dead letter)"
        typer.echo(
            f"{info['dlq']} {info['event_id'] or '-'} {info['event_type'] or '-'} "
            f"from {info['source']}: {info['reason']}: {info['error']}{copy}"
        )


@dlq_app.command("replay")
def dlq_replay(
    event_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="EVENT_ID", help="Event ids (UUIDs) to replay.", show_default=False),
    ] = None,
    *,
    replay_all: Annotated[
        bool, typer.Option("--all", help="Replay every dead-lettered record.")
    ] = False,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    dlq_suffix: DlqSuffix = ".dlq",
    json_output: JsonOutput = False,
) -> None:
    """Publish dead-lettered events again to the partitions they came from (after fixing the
    handler, say). Each takes effect once; a replayed event comes after newer ones of its key."""
    if not event_ids and not replay_all:
        raise _fail_config(ConfigurationError("give event ids to replay, or --all"))
    wanted = set(map(str, _event_ids(event_ids or [])))
    letters = _read_dlq(kafka_bootstrap_servers, _dlq_topics(topics, dlq_suffix), None)
    if not replay_all:
        letters = [d for d in letters if d.event_id in wanted]
        missing = wanted - {d.event_id for d in letters}
        if missing:
            typer.echo(
                f"error: no dead-lettered record with event id {', '.join(sorted(missing))}",
                err=True,
            )
            raise typer.Exit(EXIT_FAILED)
    letters = unique_dead_letters(letters)  # each dead-lettering once, not each copy of it
    with Progress(disable=json_output, transient=True) as progress:
        task = progress.add_task("replaying", total=len(letters))
        try:
            sent = asyncio.run(
                replay_dead_letters(
                    _bootstrap(kafka_bootstrap_servers),
                    letters,
                    on_sent=lambda _: progress.advance(task),
                )
            )
        except (DeadLetterError, KafkaError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_FAILED) from None
    if json_output:
        typer.echo(json.dumps({"replayed": [d.summary() for d in letters]}, indent=2))
    else:
        typer.echo(f"replayed {sent} record(s)")


@inbox_app.command("status")
def inbox_status(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:INBOX|NAME",
            help="The inbox: your Inbox object as module:attribute, or its name (then give "
            "--topics).",
        ),
    ],
    *,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    stall_after: Annotated[
        float,
        typer.Option(
            envvar="OUTBOXKIT_STALL_AFTER",
            metavar="SECONDS",
            help="Seconds without progress, with records pending, that make a partition stalled.",
        ),
    ] = 60.0,
    json_output: JsonOutput = False,
) -> None:
    """Each partition's offset, pending records, last progress and last error, from Kafka (the
    workers write them with their offsets). Exit code 1 if a partition is stalled or parked."""
    try:
        imported = _import_inbox(target) if ":" in target else None
    except ConfigurationError as exc:
        raise _fail_config(exc) from None
    name = imported.name if imported is not None else target
    names = [t.strip() for t in (topics or "").split(",") if t.strip()]
    names = names or (imported.topics if imported is not None else [])
    if not names:
        raise _fail_config(ConfigurationError("OUTBOXKIT_TOPICS is not set: give --topics"))
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        status = asyncio.run(
            read_status(
                _bootstrap(kafka_bootstrap_servers),
                f"outboxkit.inbox.{name}",
                names,
                stall_after=stall_after,
            )
        )
    except (ConfigurationError, KafkaError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if json_output:
        typer.echo(json.dumps(asdict(status) | {"ok": status.ok}, indent=2))
    else:
        typer.echo(f"group {status.group}: {status.members} worker(s)")
        for p in status.partitions:
            label = "PARKED " if p.parked else "STALLED" if p.stalled else "ok     "
            since = "-" if p.seconds_since_progress is None else f"{p.seconds_since_progress} s"
            line = f"{label} {p.partition} offset {p.offset} pending {p.pending}"
            line += f", progress {since} ago"
            if p.parked:
                line += f"; parked: {p.parked}"
            if p.last_error and not p.ok:
                line += f"; last error: {p.last_error}"
            typer.echo(line)
    if not status.ok:
        raise typer.Exit(EXIT_FAILED)


topics_app = typer.Typer(
    help="Kafka topics: create them (with their dead-letter topics), describe them, record "
    "their partition counts for writers.",
    no_args_is_help=True,
)
app.add_typer(topics_app, name="topics")
topics_app.command("create")(topics_cli.create)
topics_app.command("describe")(topics_cli.describe)
app.add_typer(dev_app, name="dev")


@topics_app.command("sync")
def topics_sync(
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    json_output: JsonOutput = False,
) -> None:
    """Record the topics' partition counts (from Kafka) in the database, so that writers can
    add events for them before a relay has started (the relay does this itself at start)."""
    settings = _settings(
        ConnectionSettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
    )
    if not settings.topics:
        raise _fail_config(ConfigurationError("OUTBOXKIT_TOPICS is not set: give --topics"))
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    asyncio.run(preflight(settings, topics=settings.topics))
    try:
        counts = asyncio.run(partition_counts(settings.kafka_bootstrap_servers, settings.topics))
    except (ConfigurationError, KafkaError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    _run_storage(database_url, lambda storage: storage.register_topics(counts))
    if json_output:
        typer.echo(json.dumps(counts, indent=2))
    else:
        for topic, partitions in sorted(counts.items()):
            typer.echo(f"{topic}: {partitions} partitions")


def main(argv: Sequence[str] | None = None) -> None:
    """The ``outboxkit`` command: expected failures end it with one or two lines on stderr and
    a non-zero exit code; ``--debug`` (anywhere) or ``OUTBOXKIT_LOG_LEVEL=debug`` adds the
    traceback."""
    global _debug  # noqa: PLW0603
    args = list(sys.argv[1:] if argv is None else argv)
    _debug = os.environ.get("OUTBOXKIT_LOG_LEVEL", "").strip().lower() == "debug"
    if "--debug" in args[: args.index("--") if "--" in args else len(args)]:
        args.remove("--debug")
        args.insert(0, "--debug")  # an option of the root command, wherever it was typed
    try:
        app(args=_inbox_runs_by_default(args))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if _debug:
            raise
        problems = explain(exc)
        if problems is None:  # not expected: a bug, worth its traceback in a report
            typer.echo(f"error: unexpected {type(exc).__name__}: {exc}", err=True)
            typer.echo("  → Run again with --debug for the traceback, and report it.", err=True)
            sys.exit(EXIT_FAILED)
        for problem in problems:
            for line in problem.lines():
                typer.echo(line, err=True)
        sys.exit(max(p.exit_code for p in problems))


def _inbox_runs_by_default(args: list[str]) -> list[str]:
    """``outboxkit inbox module:obj`` means ``outboxkit inbox run module:obj``."""
    at = 1 if args[:1] == ["--debug"] else 0
    if (
        len(args) >= at + 2
        and args[at] == "inbox"
        and args[at + 1] not in {"run", "dlq", "status", "--help"}
    ):
        return [*args[:at], "inbox", "run", *args[at + 1 :]]
    return args
