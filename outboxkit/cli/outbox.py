"""``outboxkit outbox …``: inspect and repair the outbox (pending, failed, retry, skip, replay)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated
from uuid import UUID

import typer

from outboxkit.cli.common import EXIT_FAILED, parse_event_ids, run_operations, run_storage
from outboxkit.cli_options import DatabaseUrl, JsonOutput, Limit
from outboxkit.core.printable import key_text, printable

outbox_app = typer.Typer(
    help="Inspect and repair the outbox: pending backlog, failed records, retry, skip, replay.",
    no_args_is_help=True,
)

EventIds = Annotated[list[str], typer.Argument(metavar="EVENT_ID", help="Event ids (UUIDs).")]


@outbox_app.command("pending")
def outbox_pending(database_url: DatabaseUrl = None, json_output: JsonOutput = False) -> None:
    """Pending and failed records per partition, and the age of the oldest pending one."""
    backlog = run_storage(database_url, lambda s: s.backlog())
    if json_output:
        typer.echo(json.dumps([asdict(b) for b in backlog], default=str, indent=2))
        return
    if not backlog:
        typer.echo("nothing pending")
    now = datetime.now(UTC)
    for b in backlog:
        age = f"{b.age(now.timestamp()):.1f} s" if b.pending else "-"
        typer.echo(
            f"{printable(b.topic)}/{b.partition}: {b.pending} pending (oldest {age}), "
            f"{b.failed} failed"
        )


@outbox_app.command("failed")
def outbox_failed(
    database_url: DatabaseUrl = None, limit: Limit = 100, json_output: JsonOutput = False
) -> None:
    """Records the broker refused (parked after retries), with their errors."""
    records = run_operations(database_url, lambda o: o.list_records("failed", limit))
    if json_output:
        rows = [asdict(r) | {"key": key_text(r.key)} for r in records]
        typer.echo(json.dumps(rows, default=str, indent=2))
        return
    if not records:
        typer.echo("no failed records")
    for r in records:
        # What a writer or the broker put in a record: escaped, never sent to the terminal.
        typer.echo(
            printable(
                f"{r.event_id} {r.event_type} {r.topic}/{r.partition} key={key_text(r.key)} "
                f"attempts={r.attempts}: {r.last_error}"
            )
        )


def _repair(
    database_url: str | None, ids: list[UUID], verb: str, method: str, json_output: bool
) -> None:
    count = run_operations(database_url, lambda o: getattr(o, method)(ids))
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
    """Put failed records back in line (their key stays held back until they are published)."""
    _repair(database_url, parse_event_ids(event_ids), "retrying", "retry_failed", json_output)


@outbox_app.command("skip")
def outbox_skip(
    event_ids: EventIds, database_url: DatabaseUrl = None, json_output: JsonOutput = False
) -> None:
    """Drop failed records without publishing them; their keys flow again."""
    _repair(database_url, parse_event_ids(event_ids), "skipped", "skip_failed", json_output)


@outbox_app.command("replay")
def outbox_replay(
    event_ids: EventIds, database_url: DatabaseUrl = None, json_output: JsonOutput = False
) -> None:
    """Publish kept (published) records again, after everything pending. Needs a retention
    (OUTBOXKIT_RETENTION) so that published records are kept."""
    _repair(database_url, parse_event_ids(event_ids), "replaying", "replay", json_output)
