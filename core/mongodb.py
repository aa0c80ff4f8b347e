"""MongoDB clients and transactions for outboxkit's own operations (the relay's and the inbox's).

Every collection of outboxkit lives in the database named by the URL's path
(``mongodb://host/shop?replicaSet=rs0`` → database ``shop``), under the ``outboxkit.`` prefix
(``outboxkit.outbox``, ``outboxkit.inbox``, …), as PostgreSQL keeps them in schema ``outboxkit``:
the service's own collections sit beside them, so one transaction covers both.

Transactions follow the driver's documented retry rules: a ``TransientTransactionError`` (a
write conflict with a concurrent transaction, a primary that stepped down) retries the whole
transaction; an ``UnknownTransactionCommitResult`` retries only the commit, which the server
applies at most once. What still fails after a bounded number of attempts surfaces as the
caller's retriable *unavailable* error.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ConfigurationError as DriverConfigurationError
from pymongo.errors import (
    ConnectionFailure,
    NetworkTimeout,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.read_concern import ReadConcern
from pymongo.uri_parser import parse_uri
from pymongo.write_concern import WriteConcern

from outboxkit.core.exceptions import ConfigurationError, OutboxkitError

T = TypeVar("T")

Document = dict[str, Any]
Client = AsyncMongoClient[Document]
Database = AsyncDatabase[Document]
Collection = AsyncCollection[Document]

#: Prefix of outboxkit's collections in the service's database.
PREFIX = "outboxkit."

#: How long one transaction keeps being retried after transient errors (write conflicts with
#: concurrent writers of the same key or dedupe record) before giving up. The driver's own
#: with_transaction allows 120 s; a conflict lasts as long as the other transaction, so a
#: count of attempts would give up on a slow but healthy competitor.
TRANSACTION_TIME_LIMIT = 30.0
#: Commit retries after an unknown commit result, per attempt.
COMMIT_ATTEMPTS = 5

#: Reads and writes that must survive a failover: a record is published only once a majority
#: has it (a relay that read a write a failover later rolls back would publish a ghost event).
MAJORITY_READ = ReadConcern("majority")
MAJORITY_WRITE = WriteConcern("majority")


def parse_url(url: str) -> dict[str, Any]:
    """``url`` as pymongo reads it (``nodelist``, ``username``, ``password``, ``database``,
    ``options``…), without the DNS look-up ``parse_uri`` does for ``mongodb+srv://``: reading a
    URL never touches the network. Raises pymongo's error (which never quotes the URL)."""
    try:
        from pymongo.uri_parser_shared import _validate_uri  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a pymongo that moved it: the public parser
        return parse_uri(url, validate=False, warn=False, normalize=False)
    return _validate_uri(url, validate=False, warn=False, normalize=False)


def database_name(url: str) -> str:
    """The database ``url`` names (as the driver reads it: a ``#`` or ``?`` in a password
    leaves it where it is); outboxkit needs one to put its collections in."""
    try:
        name = parse_url(url)["database"]
    except (PyMongoError, ValueError):
        name = None
    if not name:
        raise ConfigurationError(
            "OUTBOXKIT_DATABASE_URL: name the database in the MongoDB URL's path, e.g. "
            "mongodb://host:27017/shop?replicaSet=rs0"
        )
    return str(name)


def make_client(
    url: str,
    *,
    connect_timeout: float,
    app_name: str,
    read_timeout: float | None = None,
    **options: Any,
) -> Client:
    """A client that reads UUIDs as :class:`uuid.UUID` and dates as aware datetimes, and whose
    unreachable server surfaces within ``connect_timeout``. ``app_name`` shows in mongod's logs
    and ``currentOp``, like ``application_name`` on PostgreSQL; ``options`` are more of
    pymongo's.

    ``read_timeout`` is pymongo's ``socketTimeoutMS``: a read that gets nothing for that long
    fails with a ``NetworkTimeout`` (a ``ConnectionFailure``: "database unavailable") and its
    connection is closed. Without it a half-open link (data stops, the socket stays open)
    leaves an operation waiting for good. Keep it above the longest operation and above a
    change stream's await time (1 s)."""
    timeout_ms = int(connect_timeout * 1000)
    if read_timeout is not None:
        options["socketTimeoutMS"] = int(read_timeout * 1000)
    client: Client = AsyncMongoClient(
        url,
        appname=app_name,
        uuidRepresentation="standard",
        tz_aware=True,
        serverSelectionTimeoutMS=timeout_ms,
        connectTimeoutMS=timeout_ms,
        **options,
    )
    _clients.add(client)
    return client


#: Every client :func:`make_client` made and not yet collected (see :func:`_drop_connections`).
_clients: weakref.WeakSet[Client] = weakref.WeakSet()

#: What pymongo raises for an operation with an explicit session (a transaction, a snapshot
#: read) on a pooled connection whose handshake found its member neither primary nor secondary:
#: one opened during a step-down, an election or a member's start. pymongo keeps such a
#: connection in its pool and fails every explicit-session operation that gets it the same way,
#: before sending anything, for as long as it lives (tests/integration/test_failover_mongodb.py
#: makes one); an inbox worker exited on it in a rolling restart.
_NO_SESSIONS = "Sessions are not supported by this MongoDB deployment"


def _is_stale_connection(exc: BaseException) -> bool:
    return isinstance(exc, DriverConfigurationError) and _NO_SESSIONS in str(exc)


async def _drop_connections() -> None:
    """Close the pooled connections of every client :func:`make_client` made, so that the next
    operations open new ones whose handshake sees each member as it is now. pymongo offers no
    public way to close one connection; this resets each server's pool (new generation, idle
    connections closed, busy ones when they are returned) without pausing it."""
    for client in list(_clients):
        topology = getattr(client, "_topology", None)
        for server in list(getattr(topology, "_servers", {}).values()):
            with contextlib.suppress(Exception):  # best effort: a pool already closed
                await server.pool.reset_without_pause()


class MongoConnection:
    """A client of its own to the database named by ``url``, closed on leaving ``async with``:
    the base of outboxkit's MongoDB stores."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        app_name: str,
        read_timeout: float | None = None,
    ) -> None:
        self._client: Client = make_client(
            url, connect_timeout=connect_timeout, app_name=app_name, read_timeout=read_timeout
        )
        self.database: Database = self._client.get_database(database_name(url))

    @property
    def client(self) -> Client:
        return self._client

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._close_own_clients()
        finally:
            await self._client.close()

    async def _close_own_clients(self) -> None:
        """Close what a store holds beside its client (another client), before the client."""


def collection(database: Database, name: str, **options: Any) -> Collection:
    return database.get_collection(PREFIX + name, **options)


#: Server errors of a member that is not (or no longer) the primary, or is shutting down: what a
#: step-down, an election or a restart answers. The driver raises most of them as
#: ``NotPrimaryError`` (a ``ConnectionFailure``), but not inside a write concern error: a
#: ``majority`` write the primary applied and then stepped down before a majority had it fails
#: with ``WriteConcernError`` code 11602 and no retryable label (an ``update_many`` or
#: ``delete_many`` is not a retryable write). Its outcome is unknown; trying again is right.
_FAILOVER_CODES = frozenset(
    {
        91,  # ShutdownInProgress
        189,  # PrimarySteppedDown
        10107,  # NotWritablePrimary
        11600,  # InterruptedAtShutdown
        11602,  # InterruptedDueToReplStateChange
        13435,  # NotPrimaryNoSecondaryOk
        13436,  # NotPrimaryOrSecondary
    }
)


def is_unavailable(exc: BaseException) -> bool:
    """A failure of the server or the network, not of the operation: trying later may work.
    That includes a primary that stepped down or shut down under the operation (a failover), and
    a connection opened during one (whose connections :func:`guarded` and
    :func:`in_transaction` then drop)."""
    return (
        isinstance(exc, ConnectionFailure)
        or (isinstance(exc, PyMongoError) and exc.has_error_label("RetryableWriteError"))
        or (isinstance(exc, OperationFailure) and exc.code in _FAILOVER_CODES)
        or _is_stale_connection(exc)
    )


def is_transient(exc: BaseException) -> bool:
    """A conflict with a concurrent transaction, or a primary that stepped down: the whole
    transaction may be tried again. Not a server selection timeout, although the driver labels
    it transient inside a transaction: the client already waited ``serverSelectionTimeoutMS``
    for a primary, and ten more such waits would hide a database that is down for minutes."""
    return _has_label(exc, "TransientTransactionError") and not isinstance(
        exc, ServerSelectionTimeoutError
    )


def describe(exc: BaseException) -> str:
    """``exc`` in one line, without the topology description pymongo appends to a server
    selection timeout (a thousand characters of every member's state, on every retry during an
    election): ``No replica set members match selector "Primary()", Timeout: 10.0s``."""
    text = str(exc).split(", Topology Description:", 1)[0]
    return text.splitlines()[0] if text else repr(exc)


def _has_label(exc: BaseException, label: str) -> bool:
    return isinstance(exc, PyMongoError) and exc.has_error_label(label)


async def _backoff(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0, min(0.002 * 2**attempt, 0.2)))


#: What mongod answers for a transaction it aborted behind the client's back (its lifetime
#: ran out, also after a failover): NoSuchTransaction; TransactionExceededLifetimeLimitSeconds
#: on servers that say why.
_ABORTED_CODES = frozenset({251, 290})


async def in_transaction(
    client: Client,
    work: Callable[[AsyncClientSession], Awaitable[T]],
    *,
    unavailable: type[OutboxkitError],
    too_long: Callable[[float], OutboxkitError] | None = None,
    lifetime: float | None = None,
) -> T:
    """Run ``work(session)`` in a multi-document transaction and commit it.

    ``work`` may run more than once (after a transient error its effects were rolled back);
    an exception it raises aborts the transaction and propagates. Server and network failures
    that outlast the retries raise ``unavailable``. A transaction that mongod aborted after it
    ran ``lifetime`` seconds or more (``transactionLifetimeLimitSeconds``) raises
    ``too_long(seconds it ran)`` instead of being run again: it would only be aborted again.

    A transaction given up on a silent server (a ``NetworkTimeout``: ``socketTimeoutMS``) is
    not retried here, and may still be open on mongod, holding its write locks until
    ``transactionLifetimeLimitSeconds`` (60 s): its session is killed (``killSessions``) before
    the next transaction on ``client``, once the server answers again, so that the retry does
    not meet write conflicts with it for that long."""
    await _kill_abandoned(client)
    async with client.start_session() as session:
        deadline = time.monotonic() + TRANSACTION_TIME_LIMIT
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            started = time.monotonic()
            await session.start_transaction(write_concern=MAJORITY_WRITE)
            try:
                result = await work(session)
            except BaseException as exc:
                if session.in_transaction:
                    with contextlib.suppress(PyMongoError):  # the server aborts it anyway
                        await session.abort_transaction()
                _raise_if_outlived(exc, time.monotonic() - started, lifetime, too_long)
                if _is_stale_connection(exc):
                    await _drop_connections()  # nothing reached mongod: run it again
                    continue
                if isinstance(exc, NetworkTimeout):  # see _commit
                    _abandon(client, session)
                    raise unavailable(f"MongoDB is unavailable: {describe(exc)}") from exc
                if is_transient(exc):
                    await _backoff(attempt)
                    continue
                if is_unavailable(exc):
                    raise unavailable(f"MongoDB is unavailable: {describe(exc)}") from exc
                raise
            try:
                await _commit(session)
            except PyMongoError as exc:
                if isinstance(exc, NetworkTimeout):
                    _abandon(client, session)
                _raise_if_outlived(exc, time.monotonic() - started, lifetime, too_long)
                if is_transient(exc):
                    await _backoff(attempt)
                    continue
                if _is_stale_connection(exc):
                    await _drop_connections()
                if is_unavailable(exc) or _has_label(exc, "UnknownTransactionCommitResult"):
                    raise unavailable(f"MongoDB is unavailable: {describe(exc)}") from exc
                raise
            return result
    raise unavailable(f"MongoDB transaction still conflicting after {TRANSACTION_TIME_LIMIT:.0f} s")


#: Per client, the sessions (``lsid``) of transactions given up on a silent server, to kill.
_abandoned: weakref.WeakKeyDictionary[Client, list[Document]] = weakref.WeakKeyDictionary()


def _abandon(client: Client, session: AsyncClientSession) -> None:
    _abandoned.setdefault(client, []).append(dict(session.session_id))


async def _kill_abandoned(client: Client) -> None:
    """Kill the sessions of transactions given up on a silent server (:func:`in_transaction`):
    mongod aborts what they left open and releases its locks. Committed ones are not undone (a
    committed transaction is no longer the session's). Kept for the next time while the server
    does not answer; dropped if it refuses (a user may kill its own sessions, so it should not)."""
    lsids = _abandoned.pop(client, None)
    if not lsids:
        return
    try:
        await client.admin.command({"killSessions": lsids})
    except ConnectionFailure:
        _abandoned.setdefault(client, []).extend(lsids)
    except PyMongoError:
        pass  # refused: mongod aborts them at their transaction lifetime


def _raise_if_outlived(
    exc: BaseException,
    elapsed: float,
    lifetime: float | None,
    too_long: Callable[[float], OutboxkitError] | None,
) -> None:
    if (
        too_long is not None
        and lifetime is not None
        and elapsed >= lifetime
        and isinstance(exc, OperationFailure)
        and exc.code in _ABORTED_CODES
    ):
        raise too_long(elapsed) from exc


async def _commit(session: AsyncClientSession) -> None:
    """Commit, retrying an unknown result. Not after a read given up on a silent server
    (``socketTimeoutMS``, a ``NetworkTimeout``): each retry would wait as long again on what is
    likely a dead link (five commits, or a whole transaction run again for
    :data:`TRANSACTION_TIME_LIMIT`: 26 s behind a half-open link with a 3 s bound). The caller
    gets its *unavailable* error at once and retries later; the transaction's own effects (a
    dedupe record) say whether it committed."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            await session.commit_transaction()
            return
        except PyMongoError as exc:
            if not _has_label(exc, "UnknownTransactionCommitResult") or isinstance(
                exc, (ServerSelectionTimeoutError, NetworkTimeout)
            ):
                raise
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            await _backoff(attempt)


async def guarded(operation: Awaitable[T], unavailable: type[OutboxkitError]) -> T:
    """Await one operation; a server or network failure surfaces as ``unavailable``."""
    try:
        return await operation
    except PyMongoError as exc:
        if _is_stale_connection(exc):
            await _drop_connections()
        if is_unavailable(exc):
            raise unavailable(f"MongoDB is unavailable: {describe(exc)}") from exc
        raise


def require_transaction(session: object, error: type[OutboxkitError]) -> AsyncClientSession:
    """``session`` as a pymongo session inside a transaction, or ``error``."""
    if not isinstance(session, AsyncClientSession) or not session.in_transaction:
        raise error(
            "outbox writes need the caller's MongoDB session inside a multi-document "
            "transaction: `async with client.start_session() as s: "
            "await s.with_transaction(callback)`"
        )
    return session
