"""``outboxkit check``: can this configuration work? Each check says what is wrong and what to do.

Checks never raise: every failure, expected or not, becomes a :class:`CheckResult` with a fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError
from psycopg.conninfo import conninfo_to_dict
from pymongo import AsyncMongoClient
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError
from pymongo.uri_parser import parse_uri

from outboxkit.core import kafka_clients
from outboxkit.core.kafka import create_command
from outboxkit.core.login import refused_login
from outboxkit.core.mongodb import database_name, make_client
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings
from outboxkit.kafka_handshake import diagnose_handshake
from outboxkit.kafka_permissions import principal
from outboxkit.migrations import Migration, MigrationError
from outboxkit.migrations.mongodb import pending_migrations as pending_mongodb_migrations
from outboxkit.migrations.postgres import pending_migrations


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    summary: str
    fix: str | None = None
    #: The server did not answer (it may be starting, restarting or failing over): a worker
    #: waits for it during its start-up grace. False for what waiting cannot fix (a refused
    #: login, a missing table, a certificate).
    unreachable: bool = False
    #: Kafka refused an operation to this principal (an ACL is missing): the other ACLs of a
    #: worker are still worth checking in the same run.
    denied: bool = False
    #: The topics Kafka would not describe to this principal (the worker's ACL probes name the
    #: READ or WRITE it needs on each instead).
    refused_topics: tuple[str, ...] = ()
    #: The exception behind a failed check, if one was raised (``--debug`` shows its
    #: traceback); not part of the result's JSON.
    error: BaseException | None = field(default=None, repr=False, compare=False)

    def as_json(self) -> dict[str, object]:
        """The result for ``outboxkit check --json``."""
        return {
            "name": self.name,
            "ok": self.ok,
            "summary": self.summary,
            "fix": self.fix,
            "unreachable": self.unreachable,
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


#: Seconds the direct probe of each MongoDB host waits at most (check_mongodb).
_PROBE_SECONDS = 2.0

DEV_HINT = 'on a laptop, `eval "$(outboxkit dev up)"` starts PostgreSQL and Kafka'


#: What PostgreSQL (or libpq, before asking it) says when it will not let this user in.
_PG_LOGIN_REFUSED = re.compile(
    r"authentication failed|role .* does not exist|no pg_hba|no password supplied|"
    r"not permitted to log in"
)


def _pg_user(message: str, where: str | None) -> str | None:
    """The user PostgreSQL refused: named in its message, else the URL's."""
    named = re.search(r'(?:user|role) "([^"]+)"', message)
    if named:
        return named.group(1)
    if where:
        with contextlib.suppress(psycopg.Error):
            user = conninfo_to_dict(where).get("user")
            return str(user) if user else None
    return None


def _pg_reason(message: str) -> str:
    """The server's (or libpq's) own words, without the connection preamble."""
    for marker in ("FATAL:", "failed: "):
        if marker in message:
            return message.rsplit(marker, 1)[1].strip()
    return message


def explain_database_error(exc: psycopg.Error, where: str | None = None) -> tuple[str, str | None]:
    """What failed (naming the server ``where``, if given) and what to do, for a driver error."""
    message = _first_line(exc)
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
    if _PG_LOGIN_REFUSED.search(message):
        return refused_login(
            f"PostgreSQL{at}",
            _pg_user(message, where),
            "the user and password in OUTBOXKIT_DATABASE_URL"
            + (", and pg_hba.conf" if "pg_hba" in message else ""),
            _pg_reason(message),
        ), None
    if re.search(r"database .* does not exist", message):
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


async def check_postgresql(settings: ConnectionSettings) -> list[CheckResult]:
    where = redact(settings.database_url)
    try:
        conn = await psycopg.AsyncConnection.connect(
            settings.database_url,
            autocommit=True,
            connect_timeout=max(1, round(settings.connect_timeout)),
            application_name="outboxkit-check",
        )
    except psycopg.Error as exc:
        summary, fix = explain_database_error(exc, where)
        unreachable = summary.startswith("cannot connect")
        return [CheckResult("database", False, summary, fix, unreachable=unreachable, error=exc)]
    except OSError as exc:
        summary, fix = explain_database_error(psycopg.OperationalError(str(exc)), where)
        return [CheckResult("database", False, summary, fix, unreachable=True, error=exc)]
    async with conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
        results = [CheckResult("database", True, f"PostgreSQL {row[0] if row else '?'} at {where}")]
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
                    f"cannot read the migration state: {_first_line(exc)}",
                    "Grant this user USAGE on schema outboxkit and SELECT on its tables.",
                    error=exc,
                )
            )
        else:
            results.append(_migrations_result(pending, where))
        return results


def _migrations_result(pending: list[Migration], where: str) -> CheckResult:
    if not pending:
        return CheckResult("migrations", True, "schema is up to date")
    labels = ", ".join(m.label for m in pending)
    # Every migration pending (the first creates the schema): a newcomer's "not migrated yet".
    state = "does not exist" if pending[0].version == 1 else "is not up to date"
    return CheckResult(
        "migrations",
        False,
        f"outboxkit's schema {state} in {where} ({len(pending)} migration(s) not applied: "
        f"{labels})",
        "Run `outboxkit migrate` (on PostgreSQL you may apply `outboxkit migrate --sql` with "
        "your own migration tool).",
    )


async def _probe_mongodb(settings: ConnectionSettings, where: str) -> CheckResult | None:
    """Each host of the URL asked directly, within a couple of seconds: a failure that the
    replica-set client would only report after its whole timeout, as a dump of its topology,
    named instead — nothing answers, a standalone mongod, another replica set's name. None
    when a host answers as a member of the URL's replica set (or the URL names none)."""
    if settings.database_url.startswith("mongodb+srv://"):
        return None  # the hosts come from DNS: the replica-set client's own check applies
    try:
        parsed = parse_uri(settings.database_url, validate=False, warn=True)
    except (PyMongoError, ValueError):
        return None
    options = {name.lower(): value for name, value in parsed["options"].items()}
    if any(options.get(name) for name in ("tls", "ssl", "loadbalanced", "directconnection")):
        return None  # connections this plain probe cannot make: the client's own check applies
    wanted = options.get("replicaset")
    within_ms = int(min(settings.connect_timeout, _PROBE_SECONDS) * 1000)

    async def ask(host: str, port: int | None) -> dict[str, Any] | None:
        if port is not None:  # a TCP host, not a Unix socket's path
            # A host that refuses the connection answers nothing: said at once, where the
            # driver's server selection would try it again until the probe's time is out.
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), within_ms / 1000
                )
            except (OSError, TimeoutError):
                return None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            host,
            port,
            directConnection=True,
            serverSelectionTimeoutMS=within_ms,
            connectTimeoutMS=within_ms,
        )
        try:
            return await client.admin.command("hello")
        except PyMongoError:
            return None
        finally:
            await client.close()

    # Every host at once: one that does not answer takes the whole probe time, and one after
    # the other those added up (2 s for each host down).
    nodes: list[tuple[str, int | None]] = list(parsed["nodelist"])
    hellos = await asyncio.gather(*(ask(host, port) for host, port in nodes))
    answers = [
        (f"{host}:{port}", hello)
        for (host, port), hello in zip(nodes, hellos, strict=True)
        if hello is not None
    ]
    if not answers:
        return CheckResult(
            "database",
            False,
            f"cannot connect to MongoDB at {where}: nothing answers at "
            f"{', '.join(f'{h}:{p}' for h, p in parsed['nodelist'])}",
            "Is mongod running and reachable from here? Check OUTBOXKIT_DATABASE_URL.",
            unreachable=True,
        )
    if not wanted or any(hello.get("setName") == wanted for _, hello in answers):
        return None
    address, hello = answers[0]
    name = hello.get("setName")
    if name is None:
        return CheckResult(
            "database",
            False,
            f"MongoDB at {address} is a standalone mongod, not a member of replica set "
            f"{wanted} (the URL's replicaSet)",
            REPLICA_SET_FIX,
        )
    return CheckResult(
        "database",
        False,
        f"MongoDB at {address} is a member of replica set {name}, not {wanted} (the URL's "
        "replicaSet)",
        f"Set replicaSet={name} in OUTBOXKIT_DATABASE_URL, or connect to the right set.",
    )


#: mongod's AuthenticationFailed, and its words when a driver reports it otherwise.
_MONGO_AUTH_FAILED = 18


def _mongo_login_refused(exc: PyMongoError) -> bool:
    if isinstance(exc, OperationFailure) and exc.code == _MONGO_AUTH_FAILED:
        return True
    return "Authentication failed" in str(exc)


def mongodb_user(url: str) -> str | None:
    """The user a MongoDB URL logs in as, if any."""
    with contextlib.suppress(PyMongoError, ValueError):
        return parse_uri(url, validate=False, warn=True)["username"] or None
    return None


def explain_mongodb_error(
    exc: PyMongoError, where: str, user: str | None = None
) -> tuple[str, str | None]:
    """What failed at MongoDB ``where`` and what to do: a refused login named as such (as
    ``user``), a server that does not answer, or the driver's first line."""
    if _mongo_login_refused(exc):
        details = exc.details if isinstance(exc, OperationFailure) else None
        reason = details.get("errmsg") if details else None
        check = "the user, password and authSource in OUTBOXKIT_DATABASE_URL"
        return refused_login(
            f"MongoDB at {where}", user, check, reason or _first_line(exc).split(",")[0]
        ), None
    if isinstance(exc, ConnectionFailure):
        return (
            f"cannot connect to MongoDB at {where}: {_first_line(exc)}",
            "Is mongod running and reachable from here? Check OUTBOXKIT_DATABASE_URL.",
        )
    return f"MongoDB at {where} failed: {_first_line(exc)}", None


async def check_mongodb(settings: ConnectionSettings) -> list[CheckResult]:
    server = await check_mongodb_server(settings)
    if not server.ok:
        return [server]
    return [server, await _mongodb_migrations(settings)]


#: Why outboxkit needs a replica set, and how to make one: the same words wherever it refuses a
#: standalone mongod (check, migrate, every worker).
REPLICA_SET_FIX = (
    "Change streams and multi-document transactions need a replica set: start mongod with "
    "--replSet and run rs.initiate() (a single node is enough)."
)


async def check_mongodb_server(settings: ConnectionSettings) -> CheckResult:
    """MongoDB answers, lets this user in, and is a replica set (``database``)."""
    where = redact(settings.database_url)
    probed = await _probe_mongodb(settings, where)
    if probed is not None:
        return probed
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        hello = await client.admin.command("hello")
    except PyMongoError as exc:
        summary, fix = explain_mongodb_error(exc, where, mongodb_user(settings.database_url))
        unreachable = isinstance(exc, ConnectionFailure) and not _mongo_login_refused(exc)
        return CheckResult("database", False, summary, fix, unreachable=unreachable, error=exc)
    finally:
        await client.close()
    if not hello.get("setName"):
        return CheckResult(
            "database", False, f"MongoDB at {where} is not a replica set", REPLICA_SET_FIX
        )
    return CheckResult("database", True, f"MongoDB replica set {hello['setName']} at {where}")


async def _mongodb_migrations(settings: ConnectionSettings) -> CheckResult:
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        pending = await pending_mongodb_migrations(
            client.get_database(database_name(settings.database_url))
        )
    except MigrationError as exc:
        return CheckResult("migrations", False, str(exc), "Upgrade outboxkit.", error=exc)
    except PyMongoError as exc:
        return CheckResult(
            "migrations",
            False,
            f"cannot read the migration state: {_first_line(exc)}",
            "Grant this user read access to the outboxkit.* collections.",
            error=exc,
        )
    finally:
        await client.close()
    return _migrations_result(pending, redact(settings.database_url))


async def check_kafka(
    settings: ConnectionSettings, *, topics: Sequence[str] | None = None
) -> list[CheckResult]:
    """Kafka reachable, and ``topics`` (default: ``settings.topics``) there."""
    topics = list(settings.topics if topics is None else topics)
    servers = ",".join(settings.kafka_bootstrap_servers)
    admin = kafka_clients.admin(settings, request_timeout_ms=int(settings.connect_timeout * 1000))
    try:
        async with asyncio.timeout(settings.connect_timeout):
            await admin.start()
            existing = set(await admin.list_topics())
        missing = [topic for topic in topics if topic not in existing]
        unauthorized = await _unauthorized_topics(admin, missing) if missing else []
    except Exception as exc:
        if isinstance(exc, KafkaConnectionError | TimeoutError):
            handshake = await diagnose_handshake(settings, within=settings.connect_timeout)
            if handshake.what is not None:
                return [
                    CheckResult(
                        "kafka",
                        False,
                        handshake.what,
                        handshake.fix,
                        unreachable=handshake.unreachable,
                        error=exc,
                    )
                ]
        reason = "" if isinstance(exc, KafkaConnectionError | TimeoutError) else _first_line(exc)
        return [
            CheckResult(
                "kafka",
                False,
                f"cannot reach Kafka at {servers}" + (f": {reason}" if reason else ""),
                "Is the broker running and reachable from here? Check "
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS (the broker's advertised listeners must "
                f"resolve from this host too; {DEV_HINT}).",
                unreachable=not reason,
                error=exc,
            )
        ]
    finally:
        await admin.close()
    results = [CheckResult("kafka", True, f"Kafka at {servers} ({_security(settings)})")]
    if unauthorized:
        results.append(
            CheckResult(
                "topics",
                False,
                f"Kafka does not allow {principal(settings)} DESCRIBE on "
                f"{', '.join(f'Topic:{t}' for t in unauthorized)}",
                "Grant the ACLs this worker needs (docs/security.md lists them; `outboxkit acls` "
                "prints the commands; READ or WRITE imply DESCRIBE), or fix OUTBOXKIT_TOPICS.",
                denied=True,
                refused_topics=tuple(unauthorized),
            )
        )
        missing = [topic for topic in missing if topic not in unauthorized]
    if missing:
        # One line: the topics, and the command that creates them.
        results.append(
            CheckResult(
                "topics",
                False,
                f"topic(s) {', '.join(missing)} not found on Kafka at {servers}: create them with "
                f"`{create_command(missing)}`",
            )
        )
    elif topics and not unauthorized:
        results.append(CheckResult("topics", True, f"found {', '.join(topics)}"))
    return results


def _security(settings: ConnectionSettings) -> str:
    """How this client connects: the protocol, and the SASL mechanism and user if any."""
    protocol = settings.kafka_security_protocol
    if settings.kafka_sasl_mechanism is None:
        mutual = " with a client certificate" if settings.kafka_ssl_cert_file else ""
        return f"{protocol}{mutual}"
    return f"{protocol}, {settings.kafka_sasl_mechanism} as {settings.kafka_sasl_username}"


async def _unauthorized_topics(admin: AIOKafkaAdminClient, topics: list[str]) -> list[str]:
    """Of ``topics`` (absent from the listing), those Kafka refuses to describe: with an
    authorizer, a topic one may not DESCRIBE is not listed, whether or not it exists."""
    described = await admin.describe_topics(topics)
    refused = TopicAuthorizationFailedError.errno
    return [t["topic"] for t in described if t["error_code"] == refused]


async def check_memory(settings: ConnectionSettings) -> list[CheckResult]:
    return [
        CheckResult(
            "database",
            True,
            f"in-memory database {redact(settings.database_url)} (tests only: one process, not "
            "durable)",
        )
    ]


async def run_checks(
    settings: ConnectionSettings, database: Awaitable[list[CheckResult]]
) -> list[CheckResult]:
    """``database`` (the backend's own checks, see outboxkit.backends) and Kafka's, at once."""
    db_results, kafka_results = await asyncio.gather(database, check_kafka(settings))
    return [*db_results, *kafka_results]
