"""``outboxkit relay`` (run a relay worker) and ``outboxkit relay status``."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Annotated

import typer

from outboxkit.backends import backend_for
from outboxkit.cli.common import (
    configure_worker_logging,
    load,
    run_on_loop,
    run_storage,
    run_worker,
)
from outboxkit.cli_options import (
    BootstrapServers,
    DatabaseUrl,
    HttpPort,
    JsonOutput,
    LogFormatOption,
    LogLevelOption,
    Topics,
)
from outboxkit.core.printable import printable
from outboxkit.preflight.diagnose import preflight
from outboxkit.relay import PartitionStatus, Relay, RelaySettings, group_status

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
    configure_worker_logging(log_format, log_level)
    settings = load(
        RelaySettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
        relay_name=relay_name,
    )

    async def run() -> None:
        await preflight(settings, topics=settings.topics, grace=settings.startup_grace)
        async with backend_for(settings.database_url).relay(settings) as (storage, wakeups):
            await run_worker(Relay(settings, storage, wakeups), http_port)

    run_on_loop(run(), settings.event_loop)


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
    settings = load(
        RelaySettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
        relay_name=relay_name,
    )
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # A Kafka error (a coordinator not ready on a new cluster, a broker out of reach) is told
    # by the command's one error style (outboxkit.preflight.diagnose).
    status = run_storage(settings.database_url, lambda s: group_status(settings, s))
    if json_output:
        typer.echo(json.dumps(asdict(status), indent=2))
        return
    if status.members:
        line = f"group {status.group}: {status.state}, {len(status.members)} member(s)"
    else:
        line = f"no relay of group {status.group} is running"
    typer.echo(printable(line))
    for member in status.members:
        # Member and client ids are what each member of the group chose: escaped, never raw.
        typer.echo(
            printable(f"member {member.member_id} (client {member.client_id}, host {member.host})")
        )
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
    return printable(
        f"{p.partition}{block}: {p.pending} pending (oldest {age}), {p.failed} failed, "
        f"last publish {last}"
    )
