"""``outboxkit check`` and ``outboxkit migrate``: before the workers start."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from typing import Annotated

import psycopg
import typer
from pymongo.errors import PyMongoError

from outboxkit.backends import backend_for
from outboxkit.check import (
    check_mongodb_server,
    explain_database_error,
    explain_mongodb_error,
    mongodb_user,
    run_checks,
)
from outboxkit.cli import common
from outboxkit.cli.common import EXIT_FAILED, load
from outboxkit.cli_options import BootstrapServers, DatabaseUrl, JsonOutput, Topics
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings
from outboxkit.migrations import MigrationError, load_migrations
from outboxkit.migrations.postgres import script


def check(
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    json_output: JsonOutput = False,
) -> None:
    """Connect to the database and the broker and say what is wrong, if anything."""
    settings = load(
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
    settings = load(ConnectionSettings, database_url=database_url)
    backend = backend_for(settings.database_url)
    if backend.kind == "mongodb":
        _refuse_what_workers_refuse(settings)
    try:
        applied = asyncio.run(backend.migrate(settings.connect_timeout))
    except psycopg.Error as exc:
        what, fix = explain_database_error(exc, redact(settings.database_url))
        typer.echo(f"error: migrating failed: {what}", err=True)
        if fix:
            typer.echo(f"  → {fix}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except PyMongoError as exc:
        url = settings.database_url
        what, fix = explain_mongodb_error(exc, redact(url), mongodb_user(url))
        typer.echo(f"error: migrating failed: {what}", err=True)
        if fix:
            typer.echo(f"  → {fix}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except MigrationError as exc:
        typer.echo(f"error: migrating {redact(settings.database_url)} failed: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if applied:
        typer.echo("applied " + ", ".join(applied))
    else:
        typer.echo("schema is up to date")


def _refuse_what_workers_refuse(settings: ConnectionSettings) -> None:
    """MongoDB: a server the workers would refuse (a standalone mongod, which has neither
    transactions nor change streams; a refused login) is refused before anything is created,
    with the line ``check`` and the workers print, rather than migrated as if it would do."""
    server = asyncio.run(check_mongodb_server(settings))
    if not server.ok:
        typer.echo(f"error: {server.summary}", err=True)
        if server.fix:
            typer.echo(f"  → {server.fix}", err=True)
        raise typer.Exit(EXIT_FAILED)
