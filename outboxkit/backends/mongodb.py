"""outboxkit on MongoDB, as the CLI, the service and the testing plugin use it: the relay's
storage and change-stream wake-ups, the inbox store, a service's transactions, migrations,
``outboxkit check`` and what pymongo's errors mean. Imported only for a ``mongodb://`` URL
(:func:`outboxkit.backends.backend_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC
from typing import Any, TypeVar

from pymongo import AsyncMongoClient
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError
from pymongo.uri_parser import parse_uri

from outboxkit.backends import RelayParts, Transactions
from outboxkit.backends.checks import CheckResult, clock_result, first_line, migrations_result
from outboxkit.core.login import refused_login
from outboxkit.core.mongodb import (
    MongoConnection,
    collection,
    database_name,
    in_transaction,
    make_client,
)
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings, DatabaseKind
from outboxkit.inbox import InboxSettings, InboxStore, MongoInboxStore
from outboxkit.migrations import Migration, MigrationError
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.mongodb import pending_migrations
from outboxkit.relay import (
    MongoOutbox,
    MongoOutboxOperations,
    MongoOutboxStorage,
    MongoWakeups,
    OutboxOperations,
    OutboxStorage,
    RelaySettings,
    StorageUnavailableError,
)
from outboxkit.relay.mongodb.presence import running_versions

T = TypeVar("T")

#: Seconds the direct probe of each MongoDB host waits at most (check_database).
_PROBE_SECONDS = 2.0


# -- checks and errors ---------------------------------------------------------------------------


async def _probe_hosts(settings: ConnectionSettings, where: str) -> CheckResult | None:
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
_AUTH_FAILED = 18


def _login_refused(exc: PyMongoError) -> bool:
    if isinstance(exc, OperationFailure) and exc.code == _AUTH_FAILED:
        return True
    return "Authentication failed" in str(exc)


def login_user(url: str) -> str | None:
    """The user a MongoDB URL logs in as, if any."""
    with contextlib.suppress(PyMongoError, ValueError):
        return parse_uri(url, validate=False, warn=True)["username"] or None
    return None


def explain_error(exc: PyMongoError, where: str, user: str | None = None) -> tuple[str, str | None]:
    """What failed at MongoDB ``where`` and what to do: a refused login named as such (as
    ``user``), a server that does not answer, or the driver's first line."""
    if _login_refused(exc):
        details = exc.details if isinstance(exc, OperationFailure) else None
        reason = details.get("errmsg") if details else None
        check = "the user, password and authSource in OUTBOXKIT_DATABASE_URL"
        return refused_login(
            f"MongoDB at {where}", user, check, reason or first_line(exc).split(",")[0]
        ), None
    if isinstance(exc, ConnectionFailure):
        return (
            f"cannot connect to MongoDB at {where}: {first_line(exc)}",
            "Is mongod running and reachable from here? Check OUTBOXKIT_DATABASE_URL.",
        )
    return f"MongoDB at {where} failed: {first_line(exc)}", None


async def check_database(settings: ConnectionSettings) -> list[CheckResult]:
    server = await check_server(settings)
    if not server.ok:
        return [server]
    return [server, await _check_clock(settings), await _check_migrations(settings)]


async def _check_clock(settings: ConnectionSettings) -> CheckResult:
    """``clock``: this host's wall clock against the primary's (``hello``'s ``localTime``)."""
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        await client.admin.command("ping")  # connected: the next round trip is one
        before = time.time()
        hello = await client.admin.command("hello")
        after = time.time()
    except PyMongoError as exc:
        return CheckResult("clock", True, f"cannot read MongoDB's clock: {first_line(exc)}")
    finally:
        await client.close()
    server = hello["localTime"].replace(tzinfo=UTC).timestamp()  # naive UTC, to the ms
    return clock_result("MongoDB", server - (before + after) / 2, after - before)


#: Why outboxkit needs a replica set, and how to make one: the same words wherever it refuses a
#: standalone mongod (check, migrate, every worker).
REPLICA_SET_FIX = (
    "Change streams and multi-document transactions need a replica set: start mongod with "
    "--replSet and run rs.initiate() (a single node is enough)."
)


async def check_server(settings: ConnectionSettings) -> CheckResult:
    """MongoDB answers, lets this user in, and is a replica set (``database``)."""
    where = redact(settings.database_url)
    probed = await _probe_hosts(settings, where)
    if probed is not None:
        return probed
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        hello = await client.admin.command("hello")
    except PyMongoError as exc:
        summary, fix = explain_error(exc, where, login_user(settings.database_url))
        unreachable = isinstance(exc, ConnectionFailure) and not _login_refused(exc)
        return CheckResult("database", False, summary, fix, unreachable=unreachable, error=exc)
    finally:
        await client.close()
    if not hello.get("setName"):
        return CheckResult(
            "database", False, f"MongoDB at {where} is not a replica set", REPLICA_SET_FIX
        )
    return CheckResult("database", True, f"MongoDB replica set {hello['setName']} at {where}")


async def _check_migrations(settings: ConnectionSettings) -> CheckResult:
    client = make_client(
        settings.database_url, connect_timeout=settings.connect_timeout, app_name="outboxkit"
    )
    try:
        pending = await pending_migrations(
            client.get_database(database_name(settings.database_url))
        )
    except MigrationError as exc:
        return CheckResult("migrations", False, str(exc), "Upgrade outboxkit.", error=exc)
    except PyMongoError as exc:
        return CheckResult(
            "migrations",
            False,
            f"cannot read the migration state: {first_line(exc)}",
            "Grant this user read access to the outboxkit.* collections.",
            error=exc,
        )
    finally:
        await client.close()
    return migrations_result(pending, redact(settings.database_url))


# -- the backend -----------------------------------------------------------------------------------


@dataclass
class _MongoTransactions:
    client: Any
    outbox: MongoOutbox

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self.client.start_session() as session, await session.start_transaction():
            yield session

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        return await in_transaction(self.client, work, unavailable=StorageUnavailableError)

    async def registered_topics(self, topics: Collection[str]) -> set[str]:
        topics_ = collection(self.client.get_database(self.outbox.database), "topics")
        return {doc["_id"] async for doc in topics_.find({"_id": {"$in": sorted(topics)}})}


@dataclass
class MongoBackend:
    url: str
    kind: DatabaseKind = "mongodb"

    @contextlib.asynccontextmanager
    async def relay(self, settings: RelaySettings) -> AsyncIterator[RelayParts]:
        async with MongoOutboxStorage(
            self.url,
            connect_timeout=settings.connect_timeout,
            retention=settings.retention,
            read_timeout=settings.database_timeout,
        ) as storage:
            yield storage, MongoWakeups(storage.outbox)

    @contextlib.asynccontextmanager
    async def outbox_storage(self, settings: ConnectionSettings) -> AsyncIterator[OutboxStorage]:
        async with MongoOutboxStorage(self.url, connect_timeout=settings.connect_timeout) as s:
            yield s

    def outbox_operations(
        self, settings: ConnectionSettings
    ) -> contextlib.AbstractAsyncContextManager[OutboxOperations]:
        return MongoOutboxOperations(self.url, connect_timeout=settings.connect_timeout)

    @contextlib.asynccontextmanager
    async def inbox_store(self, settings: InboxSettings) -> AsyncIterator[InboxStore[Any]]:
        async with MongoInboxStore(
            self.url,
            connect_timeout=settings.connect_timeout,
            retention=settings.inbox_retention,
            read_timeout=settings.database_timeout,
        ) as store:
            yield store

    @contextlib.asynccontextmanager
    async def transactions(
        self, *, source: str, pool_size: int, connect_timeout: float
    ) -> AsyncIterator[Transactions]:
        async with MongoConnection(
            self.url, connect_timeout=connect_timeout, app_name="outboxkit-service"
        ) as conn:
            outbox = MongoOutbox(source=source, database=conn.database.name)
            yield _MongoTransactions(conn.client, outbox)

    async def migrate(self, connect_timeout: float) -> list[str]:
        async with MongoConnection(
            self.url, connect_timeout=connect_timeout, app_name="outboxkit-migrate"
        ) as conn:
            return [m.label for m in await migrate_mongodb(conn.database)]

    async def upgrade_plan(
        self, connect_timeout: float
    ) -> tuple[list[Migration], dict[str | None, int]]:
        async with MongoConnection(
            self.url, connect_timeout=connect_timeout, app_name="outboxkit-migrate"
        ) as conn:
            pending = await pending_migrations(conn.database)
            return pending, await running_versions(conn.database)

    async def check(self, settings: ConnectionSettings) -> list[CheckResult]:
        return await check_database(settings)

    async def login_problem(self, connect_timeout: float) -> str | None:
        settings = ConnectionSettings.model_construct(
            database_url=self.url, connect_timeout=connect_timeout
        )
        server = await check_server(settings)
        # A refused login, or a server outboxkit cannot use (a standalone mongod, another
        # replica set than the URL's): not waited for. A server that does not answer is.
        return None if server.ok or server.unreachable else server.summary

    def explain(self, exc: BaseException) -> tuple[str, str | None] | None:
        if isinstance(exc, PyMongoError):
            return explain_error(exc, redact(self.url), login_user(self.url))
        return None
