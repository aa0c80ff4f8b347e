"""``outboxkit check``: can this configuration work? Each check says what is wrong and what to do.

Checks never raise: every failure, expected or not, becomes a :class:`CheckResult` with a fix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
from aiokafka.admin import AIOKafkaAdminClient
from pymongo.errors import PyMongoError

from outboxkit.core.mongo import database_name, make_client
from outboxkit.core.settings import ConnectionSettings
from outboxkit.migrations import Migration, MigrationError, pending_migrations
from outboxkit.migrations.mongo import pending_migrations as pending_mongodb_migrations


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    summary: str
    fix: str | None = None


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def check_postgresql(settings: ConnectionSettings) -> list[CheckResult]:
    where = redact(settings.database_url)
    try:
        conn = await psycopg.AsyncConnection.connect(
            settings.database_url,
            autocommit=True,
            connect_timeout=max(1, round(settings.connect_timeout)),
        )
    except (psycopg.Error, OSError) as exc:
        return [
            CheckResult(
                "database",
                False,
                f"cannot connect to PostgreSQL at {where}: {_first_line(exc)}",
                "Is the server running and reachable from here? Check host, port, user, password "
                "and database name in OUTBOXKIT_DATABASE_URL.",
            )
        ]
    async with conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
        results = [CheckResult("database", True, f"PostgreSQL {row[0] if row else '?'} at {where}")]
        try:
            pending = await pending_migrations(conn)
        except MigrationError as exc:
            results.append(CheckResult("migrations", False, str(exc), "Upgrade outboxkit."))
        except psycopg.Error as exc:
            results.append(
                CheckResult(
                    "migrations",
                    False,
                    f"cannot read the migration state: {_first_line(exc)}",
                    "Grant this user USAGE on schema outboxkit and SELECT on its tables.",
                )
            )
        else:
            results.append(_migrations_result(pending))
        return results


def _migrations_result(pending: list[Migration]) -> CheckResult:
    if not pending:
        return CheckResult("migrations", True, "schema is up to date")
    labels = ", ".join(m.label for m in pending)
    return CheckResult(
        "migrations",
        False,
        f"{len(pending)} migration(s) not applied: {labels}",
        "Run `outboxkit migrate` (on PostgreSQL you may apply `outboxkit migrate --sql` with "
        "your own migration tool).",
    )


async def check_mongodb(settings: ConnectionSettings) -> list[CheckResult]:
    where = redact(settings.database_url)
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        hello = await client.admin.command("hello")
    except PyMongoError as exc:
        return [
            CheckResult(
                "database",
                False,
                f"cannot connect to MongoDB at {where}: {_first_line(exc)}",
                "Is mongod running and reachable from here? Check OUTBOXKIT_DATABASE_URL.",
            )
        ]
    finally:
        await client.close()
    if not hello.get("setName"):
        return [
            CheckResult(
                "database",
                False,
                f"MongoDB at {where} is not a replica set",
                "Change streams and multi-document transactions need a replica set: start mongod "
                "with --replSet and run rs.initiate() (a single node is enough).",
            )
        ]
    results = [CheckResult("database", True, f"MongoDB replica set {hello['setName']} at {where}")]
    return [*results, await _mongodb_migrations(settings)]


async def _mongodb_migrations(settings: ConnectionSettings) -> CheckResult:
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        pending = await pending_mongodb_migrations(
            client.get_database(database_name(settings.database_url))
        )
    except MigrationError as exc:
        return CheckResult("migrations", False, str(exc), "Upgrade outboxkit.")
    except PyMongoError as exc:
        return CheckResult(
            "migrations",
            False,
            f"cannot read the migration state: {_first_line(exc)}",
            "Grant this user read access to the outboxkit.* collections.",
        )
    finally:
        await client.close()
    return _migrations_result(pending)


async def check_kafka(settings: ConnectionSettings) -> list[CheckResult]:
    servers = ",".join(settings.kafka_bootstrap_servers)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        request_timeout_ms=int(settings.connect_timeout * 1000),
    )
    try:
        async with asyncio.timeout(settings.connect_timeout):
            await admin.start()
            existing = set(await admin.list_topics())
    except Exception as exc:
        return [
            CheckResult(
                "kafka",
                False,
                f"cannot reach Kafka at {servers}: {_first_line(exc) or type(exc).__name__}",
                "Is the broker running and reachable from here? Check "
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS (the broker's advertised listeners must "
                "resolve from this host too).",
            )
        ]
    finally:
        await admin.close()
    results = [CheckResult("kafka", True, f"Kafka at {servers}")]
    missing = [topic for topic in settings.topics if topic not in existing]
    if missing:
        results.append(
            CheckResult(
                "topics",
                False,
                f"topic(s) not found: {', '.join(missing)}",
                "Create them, e.g. kafka-topics.sh --bootstrap-server "
                f"{settings.kafka_bootstrap_servers[0]} --create --topic {missing[0]} "
                "--partitions 6 --replication-factor 3 (outboxkit never creates topics).",
            )
        )
    elif settings.topics:
        results.append(CheckResult("topics", True, f"found {', '.join(settings.topics)}"))
    return results


async def check_memory(settings: ConnectionSettings) -> list[CheckResult]:
    return [
        CheckResult(
            "database",
            True,
            f"in-memory database {settings.database_url} (tests only: one process, not durable)",
        )
    ]


async def run_checks(
    settings: ConnectionSettings, database: Awaitable[list[CheckResult]]
) -> list[CheckResult]:
    """``database`` (the backend's own checks, see outboxkit.backends) and Kafka's, at once."""
    db_results, kafka_results = await asyncio.gather(database, check_kafka(settings))
    return [*db_results, *kafka_results]
