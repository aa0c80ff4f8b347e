"""outboxkit on PostgreSQL, as the CLI, the service and the testing plugin use it: the relay's
storage and wake-ups, the inbox store, a service's transactions, migrations, ``outboxkit check``
and what psycopg's errors mean. Imported only for a ``postgresql://`` URL
(:func:`outboxkit.backends.backend_for`).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from outboxkit.backends import RelayParts, Transactions
from outboxkit.backends.checks import (
    DEV_HINT,
    CheckResult,
    clock_result,
    first_line,
    migrations_result,
)
from outboxkit.core.login import refused_login
from outboxkit.core.postgres import RecoveringPool
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings, DatabaseKind
from outboxkit.inbox import InboxSettings, InboxStore
from outboxkit.inbox.postgres import PostgresInboxStore
from outboxkit.migrations import Migration, MigrationError
from outboxkit.migrations.postgres import migrate as migrate_postgresql
from outboxkit.migrations.postgres import pending_migrations
from outboxkit.relay import (
    OutboxOperations,
    OutboxStorage,
    PostgresOutbox,
    PostgresOutboxOperations,
    PostgresOutboxStorage,
    RelaySettings,
)
from outboxkit.relay.postgres.presence import running_versions

T = TypeVar("T")


# -- checks and errors ---------------------------------------------------------------------------


#: What PostgreSQL (or libpq, before asking it) says when it will not let this user in.
_LOGIN_REFUSED = re.compile(
    r"authentication failed|role .* does not exist|no pg_hba|no password supplied|"
    r"not permitted to log in"
)


#: PostgreSQL has no database of the URL's name.
_NO_DATABASE = re.compile(r"database .* does not exist")


def _refused_user(message: str, where: str | None) -> str | None:
    """The user PostgreSQL refused: named in its message, else the URL's."""
    named = re.search(r'(?:user|role) "([^"]+)"', message)
    if named:
        return named.group(1)
    if where:
        with contextlib.suppress(psycopg.Error):
            user = conninfo_to_dict(where).get("user")
            return str(user) if user else None
    return None


def _server_words(message: str) -> str:
    """The server's (or libpq's) own words, without the connection preamble."""
    for marker in ("FATAL:", "failed: "):
        if marker in message:
            return message.rsplit(marker, 1)[1].strip()
    return message


def explain_error(exc: psycopg.Error, where: str | None = None) -> tuple[str, str | None]:
    """What failed (naming the server ``where``, if given) and what to do, for a driver error."""
    message = first_line(exc)
    at = f" at {where}" if where else ""
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        return (
            f"outboxkit's tables are missing{at}: {message}",
            "Run `outboxkit migrate` (or apply `outboxkit migrate --sql` with your own tool).",
        )
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return (
            f"PostgreSQL{at} refused: {message}",
            "Grant this user USAGE on schema outboxkit and read/write on its tables.",
        )
    if _LOGIN_REFUSED.search(message):
        return refused_login(
            f"PostgreSQL{at}",
            _refused_user(message, where),
            "the user and password in OUTBOXKIT_DATABASE_URL"
            + (", and pg_hba.conf" if "pg_hba" in message else ""),
            _server_words(message),
        ), None
    if _NO_DATABASE.search(message):
        return (
            f"PostgreSQL{at} has no such database: {message}",
            "Create it (CREATE DATABASE …) or fix the name in OUTBOXKIT_DATABASE_URL.",
        )
    if isinstance(exc, psycopg.OperationalError):
        return (
            f"cannot connect to PostgreSQL{at}: {message}",
            "Is the server running and reachable from here? Check host and port in "
            f"OUTBOXKIT_DATABASE_URL ({DEV_HINT}).",
        )
    return f"PostgreSQL{at} failed: {message}", None


async def check_database(settings: ConnectionSettings) -> list[CheckResult]:
    where = redact(settings.database_url)
    try:
        conn = await psycopg.AsyncConnection.connect(
            settings.database_url,
            autocommit=True,
            connect_timeout=max(1, round(settings.connect_timeout)),
            application_name="outboxkit-check",
        )
    except psycopg.Error as exc:
        summary, fix = explain_error(exc, where)
        unreachable = summary.startswith("cannot connect")
        return [CheckResult("database", False, summary, fix, unreachable=unreachable, error=exc)]
    except OSError as exc:
        summary, fix = explain_error(psycopg.OperationalError(str(exc)), where)
        return [CheckResult("database", False, summary, fix, unreachable=True, error=exc)]
    async with conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
        results = [CheckResult("database", True, f"PostgreSQL {row[0] if row else '?'} at {where}")]
        before = time.time()
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())")
        [(server_time,)] = await cur.fetchall()
        after = time.time()
        results.append(
            clock_result("PostgreSQL", float(server_time) - (before + after) / 2, after - before)
        )
        try:
            pending = await pending_migrations(conn)
        except MigrationError as exc:
            results.append(
                CheckResult("migrations", False, str(exc), "Upgrade outboxkit.", error=exc)
            )
        except psycopg.Error as exc:
            results.append(
                CheckResult(
                    "migrations",
                    False,
                    f"cannot read the migration state: {first_line(exc)}",
                    "Grant this user USAGE on schema outboxkit and SELECT on its tables.",
                    error=exc,
                )
            )
        else:
            results.append(migrations_result(pending, where))
        return results


# -- the backend --------------------------------------------------------------------------------


@dataclass
class _PostgresTransactions:
    pool: Any
    outbox: PostgresOutbox

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        async with self.transaction() as conn:
            return await work(conn)

    async def registered_topics(self, topics: Collection[str]) -> set[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT topic FROM outboxkit.topics WHERE topic = ANY(%s)", (sorted(topics),)
            )
            return {row[0] for row in await cur.fetchall()}


@dataclass
class PostgresBackend:
    url: str
    kind: DatabaseKind = "postgresql"

    @contextlib.asynccontextmanager
    async def relay(self, settings: RelaySettings) -> AsyncIterator[RelayParts]:
        async with PostgresOutboxStorage(
            self.url,
            pool_size=settings.pool_size,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.database_timeout,
        ) as storage:
            yield storage, storage  # LISTEN/NOTIFY lives with the storage's connections

    @contextlib.asynccontextmanager
    async def outbox_storage(self, settings: ConnectionSettings) -> AsyncIterator[OutboxStorage]:
        async with PostgresOutboxStorage(
            self.url, connect_timeout=settings.connect_timeout, application_name="outboxkit-cli"
        ) as storage:
            yield storage

    def outbox_operations(
        self, settings: ConnectionSettings
    ) -> contextlib.AbstractAsyncContextManager[OutboxOperations]:
        return PostgresOutboxOperations(self.url, connect_timeout=settings.connect_timeout)

    @contextlib.asynccontextmanager
    async def inbox_store(self, settings: InboxSettings) -> AsyncIterator[InboxStore[Any]]:
        async with PostgresInboxStore(
            self.url,
            pool_size=settings.pool_size,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.database_timeout,
        ) as store:
            yield store

    @contextlib.asynccontextmanager
    async def transactions(
        self, *, source: str, pool_size: int, connect_timeout: float
    ) -> AsyncIterator[Transactions]:
        pool = RecoveringPool(
            self.url, size=pool_size, connect_timeout=connect_timeout, name="outboxkit-service"
        )
        await pool.open()
        try:
            yield _PostgresTransactions(pool, PostgresOutbox(source=source))
        finally:
            await pool.close()

    async def migrate(self, connect_timeout: float) -> list[str]:
        async with await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(connect_timeout)),
            application_name="outboxkit-migrate",
        ) as conn:
            return [m.label for m in await migrate_postgresql(conn)]

    async def upgrade_plan(
        self, connect_timeout: float
    ) -> tuple[list[Migration], dict[str | None, int]]:
        async with await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(connect_timeout)),
            application_name="outboxkit-migrate",
        ) as conn:
            return await pending_migrations(conn), await running_versions(conn)

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]:
        return await check_database(settings)

    async def login_problem(self, connect_timeout: float) -> str | None:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(1, round(connect_timeout)),
                application_name="outboxkit-service",
            )
        except psycopg.Error as exc:
            message = first_line(exc)
            if _LOGIN_REFUSED.search(message) or _NO_DATABASE.search(message):
                return explain_error(exc, redact(self.url))[0]
            return None  # not answering: an outage, not a mistake
        except OSError:
            return None
        await conn.close()
        return None

    def explain(self, exc: BaseException) -> tuple[str, str | None] | None:
        if isinstance(exc, psycopg.Error):
            return explain_error(exc, redact(self.url))
        return None
