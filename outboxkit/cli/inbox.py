"""``outboxkit inbox run`` (an inbox worker), ``outboxkit inbox status``, and the
``outboxkit inbox dlq`` group (:mod:`outboxkit.cli.dlq`)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from typing import Annotated, Any

import typer

from outboxkit.backends import backend_for
from outboxkit.cli.common import (
    EXIT_FAILED,
    configure_worker_logging,
    fail_config,
    import_user_module,
    kafka_settings,
    load,
    run_on_loop,
    run_worker,
    user_object,
)
from outboxkit.cli.dlq import dlq_app
from outboxkit.cli_options import (
    BootstrapServers,
    DatabaseUrl,
    HttpPort,
    JsonOutput,
    LogFormatOption,
    LogLevelOption,
    Topics,
)
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.printable import printable
from outboxkit.inbox import Inbox, InboxSettings, InboxWorker
from outboxkit.inbox.status import PartitionStatus, read_status
from outboxkit.preflight.diagnose import preflight

inbox_app = typer.Typer(
    help="Run an inbox worker (outboxkit inbox module:inbox), or inspect and replay its "
    "dead-letter topics (outboxkit inbox dlq …).",
    no_args_is_help=True,
)


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
    configure_worker_logging(log_format, log_level)
    try:
        inbox = _import_inbox(target)
    except ConfigurationError as exc:
        raise fail_config(exc) from None
    settings = load(
        InboxSettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics or ",".join(inbox.topics) or None,
    )
    dlqs = [f"{topic}{settings.dlq_suffix}" for topic in settings.topics]
    group = f"outboxkit.inbox.{inbox.name}"

    async def run() -> None:
        await preflight(
            settings, topics=[*settings.topics, *dlqs], group=group, grace=settings.startup_grace
        )
        async with backend_for(settings.database_url).inbox_store(settings) as store:
            worker = InboxWorker(inbox, settings, store)
            await run_worker(worker, http_port)

    run_on_loop(run(), settings.event_loop)


def _import_inbox(target: str) -> Inbox[Any]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{target!r}: give the Inbox as module:attribute")
    module = import_user_module(module_name)
    inbox: Inbox[Any] = user_object(target, module, attribute, Inbox, "outboxkit.inbox.Inbox")
    return inbox


inbox_app.add_typer(dlq_app, name="dlq")


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
        raise fail_config(exc) from None
    name = imported.name if imported is not None else target
    names = [t.strip() for t in (topics or "").split(",") if t.strip()]
    names = names or (imported.topics if imported is not None else [])
    if not names:
        raise fail_config(ConfigurationError("OUTBOXKIT_TOPICS is not set: give --topics"))
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # A Kafka error (a coordinator not ready on a new cluster, a broker out of reach) is told
    # by the command's one error style (outboxkit.preflight.diagnose).
    status = asyncio.run(
        read_status(
            kafka_settings(kafka_bootstrap_servers),
            f"outboxkit.inbox.{name}",
            names,
            stall_after=stall_after,
        )
    )
    if json_output:
        typer.echo(json.dumps(asdict(status) | {"ok": status.ok}, indent=2))
    else:
        if status.members:
            typer.echo(f"group {status.group}: {status.members} worker(s)")
        else:
            typer.echo(f"no worker of group {status.group} is running")
        for p in status.partitions:
            # Errors quote handlers' exceptions, which may quote record data: escaped.
            typer.echo(printable(_describe_partition(p)))
    if not status.ok:
        raise typer.Exit(EXIT_FAILED)


def _describe_partition(p: PartitionStatus) -> str:
    label = "PARKED " if p.parked else "STALLED" if p.stalled else "ok     "
    if p.offset is None:  # the group never committed an offset here: nothing handled yet
        line = f"{label} {p.partition} no committed offset yet, pending {p.pending}"
    else:
        line = f"{label} {p.partition} offset {p.offset} pending {p.pending}"
    if p.seconds_since_progress is not None:
        line += f", progress {p.seconds_since_progress} s ago"
    elif p.offset is not None:  # committed without a worker's state (another tool)
        line += ", no progress recorded"
    if p.parked:
        line += f"; parked: {p.parked}"
    if p.last_error and not p.ok:
        line += f"; last error: {p.last_error}"
    return line
