"""``outboxkit check`` and ``outboxkit migrate``: before the workers start."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import typer

from outboxkit.backends import Backend, backend_for
from outboxkit.backends.checks import CheckResult
from outboxkit.cli import common
from outboxkit.cli.common import EXIT_FAILED, fail_config, load
from outboxkit.cli.inbox import _import_inbox
from outboxkit.cli_options import BootstrapServers, DatabaseUrl, JsonOutput, Topics
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings
from outboxkit.inbox import InboxSettings
from outboxkit.migrations import MigrationError, load_migrations
from outboxkit.migrations.compat import incompatible, runs_beside
from outboxkit.preflight.check import run_checks
from outboxkit.preflight.diagnose import Problem, named_by, permission_problems
from outboxkit.preflight.kafka_permissions import principal
from outboxkit.relay import RelaySettings

T = TypeVar("T")


def check(
    *,
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    relay_acls: Annotated[
        bool,
        typer.Option(
            "--relay",
            help="Also check the Kafka ACLs `outboxkit relay` needs (its group from "
            "OUTBOXKIT_RELAY_NAME), as the relay does at start.",
        ),
    ] = False,
    inbox_acls: Annotated[
        str | None,
        typer.Option(
            "--inbox",
            metavar="NAME|MODULE:INBOX",
            help="Also check the Kafka ACLs this inbox's worker needs (its group, its topics "
            "and their dead-letter topics), as the worker does at start.",
        ),
    ] = None,
    json_output: JsonOutput = False,
) -> None:
    """Connect to the database and the broker and say what is wrong, if anything; with --relay
    or --inbox, also every Kafka ACL that worker lacks."""
    values = {
        "database_url": database_url,
        "kafka_bootstrap_servers": kafka_bootstrap_servers,
        "topics": topics,
    }
    settings = load(ConnectionSettings, **values)
    workers = _workers(values, relay=relay_acls, inbox=inbox_acls)
    # The checks report connection failures themselves; aiokafka would also log them.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    backend = backend_for(settings.database_url)
    results = asyncio.run(run_checks(settings, backend.check(settings)))
    if workers and all(r.ok or r.denied for r in results if r.name in {"kafka", "topics"}):
        acls = asyncio.run(_acl_results(workers))
        # A topic not described is named with the READ or WRITE the worker needs on it.
        named = [Problem(r.summary, r.fix) for r in acls if not r.ok]
        results = [r for r in results if not named_by(r, named)] + acls
    if json_output:
        typer.echo(json.dumps([r.as_json() for r in results], indent=2))
    else:
        for r in results:
            typer.echo(f"{'ok  ' if r.ok else 'FAIL'} {r.name:<11} {r.summary}")
            if r.fix:
                typer.echo(f"     {'':<11} → {r.fix}")
    if common.debug:  # the exception behind each failed check that had one
        for r in results:
            if r.error is not None:
                typer.echo(f"{r.name}:", err=True)
                traceback.print_exception(r.error, file=sys.stderr)
    if not all(r.ok for r in results):
        raise typer.Exit(EXIT_FAILED)


#: A worker whose ACLs ``check`` looks at: its settings, the topics it uses, its group (inbox).
_Worker = tuple[ConnectionSettings, list[str], str | None]


def _workers(values: dict[str, str | None], *, relay: bool, inbox: str | None) -> list[_Worker]:
    workers: list[_Worker] = []
    if relay:
        relay_settings = load(RelaySettings, **values)
        workers.append((relay_settings, relay_settings.topics, None))
    if inbox is not None:
        try:
            imported = _import_inbox(inbox) if ":" in inbox else None
        except ConfigurationError as exc:
            raise fail_config(exc) from None
        name = imported.name if imported is not None else inbox
        given = values["topics"] or (",".join(imported.topics) if imported is not None else None)
        inbox_settings = load(InboxSettings, **(values | {"topics": given}))
        dead_letters = [f"{t}{inbox_settings.dlq_suffix}" for t in inbox_settings.topics]
        workers.append(
            (inbox_settings, [*inbox_settings.topics, *dead_letters], f"outboxkit.inbox.{name}")
        )
    return workers


async def _acl_results(workers: list[_Worker]) -> list[CheckResult]:
    """Every Kafka ACL each worker lacks, one result each
    (outboxkit.preflight.kafka_permissions)."""
    results = []
    for settings, topics, group in workers:
        what = "relay" if group is None else f"inbox of group {group}"
        if settings.kafka_security_protocol == "PLAINTEXT":
            results.append(CheckResult("acls", True, f"{what}: not checked over PLAINTEXT"))
            continue
        problems = await permission_problems(settings, topics, group)
        results += [CheckResult("acls", False, p.what, p.fix, denied=True) for p in problems]
        if not problems:
            results.append(CheckResult("acls", True, f"{principal(settings)} may run the {what}"))
    return results


def migrate_command(
    database_url: DatabaseUrl = None,
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL instead of applying it (for Alembic & co).")
    ] = False,
    check_only: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Apply nothing: list the pending migrations and the outboxkit versions of the "
            "running relays, and exit 1 unless every one of them can run beside those "
            "migrations (docs/upgrading.md).",
        ),
    ] = False,
) -> None:
    """Create or upgrade outboxkit's tables (PostgreSQL) or collections and indexes (MongoDB).
    Safe to run again and concurrently."""
    if sql and check_only:
        typer.echo("error: --sql and --check go alone", err=True)
        raise typer.Exit(2)
    if check_only:
        _check_upgrade(database_url)
        return
    if sql:
        from outboxkit.migrations.postgres import script  # noqa: PLC0415 - loads psycopg

        typer.echo(script(load_migrations()), nl=False)
        return
    settings = load(ConnectionSettings, database_url=database_url)
    backend = backend_for(settings.database_url)
    if backend.kind == "mongodb":
        _refuse_what_workers_refuse(settings)
    applied = _run(
        backend,
        backend.migrate(settings.connect_timeout),
        migration_failed=f"migrating {redact(settings.database_url)} failed: ",
        driver_failed="migrating failed: ",
    )
    if applied:
        typer.echo("applied " + ", ".join(applied))
    else:
        typer.echo("schema is up to date")


def _run(
    backend: Backend,
    work: Coroutine[Any, Any, T],
    *,
    migration_failed: str = "",
    driver_failed: str = "",
) -> T:
    """``work``'s result; a migration's error, or the database driver's (as the backend explains
    it, with its fix), printed after ``error:`` and its prefix, and exit 1."""
    try:
        return asyncio.run(work)
    except MigrationError as exc:
        typer.echo(f"error: {migration_failed}{exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None  # raised here: --debug shows its context
    except Exception as exc:
        explained = backend.explain(exc)
        if explained is None:
            raise
        what, fix = explained
        typer.echo(f"error: {driver_failed}{what}", err=True)
        if fix:
            typer.echo(f"  → {fix}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


def _check_upgrade(database_url: str | None) -> None:
    """``migrate --check``: whether the running relays can all run beside the pending
    migrations (each migration's oldest release, outboxkit/migrations/compat.py)."""
    settings = load(ConnectionSettings, database_url=database_url)
    backend = backend_for(settings.database_url)
    pending, running = _run(backend, backend.upgrade_plan(settings.connect_timeout))
    for m in pending:
        oldest = runs_beside(m)
        beside = "every release" if oldest is None else f"outboxkit >= {oldest} only (contract)"
        typer.echo(f"pending {m.label}: runs beside {beside}")
    if not pending:
        typer.echo("schema is up to date")
    shown = ", ".join(
        f"{version or 'unknown (a release that recorded no version)'}: {count}"
        for version, count in sorted(running.items(), key=lambda v: str(v[0]))
    )
    typer.echo(f"running relays: {shown or 'none'}")
    problems = incompatible(pending, running)
    for problem in problems:
        typer.echo(f"FAIL {problem}")
    if problems:
        typer.echo(
            "  → Upgrade those relays first (docs/upgrading.md), then run `outboxkit migrate`."
        )
        raise typer.Exit(EXIT_FAILED)
    if not pending:
        typer.echo("ok: nothing to migrate")
    elif not running:
        typer.echo("ok: no relay is running; `outboxkit migrate` may apply them")
    else:
        typer.echo("ok: every running relay can run beside the pending migrations")


def _refuse_what_workers_refuse(settings: ConnectionSettings) -> None:
    """MongoDB: a server the workers would refuse (a standalone mongod, which has neither
    transactions nor change streams; a refused login) is refused before anything is created,
    with the line ``check`` and the workers print, rather than migrated as if it would do."""
    from outboxkit.backends.mongodb import check_server  # noqa: PLC0415 - MongoDB only

    server = asyncio.run(check_server(settings))
    if not server.ok:
        typer.echo(f"error: {server.summary}", err=True)
        if server.fix:
            typer.echo(f"  → {server.fix}", err=True)
        raise typer.Exit(EXIT_FAILED)
