"""Connection pools for outboxkit's own PostgreSQL queries (the relay's and the inbox's)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from outboxkit.core.exceptions import OutboxkitError

RV = TypeVar("RV")

#: psycopg's own default for :meth:`psycopg.AsyncConnection.wait`'s ``interval``.
_WAIT_INTERVAL = 0.1


class BoundedConnection(psycopg.AsyncConnection[TupleRow]):
    """A connection whose every wait for the server is bounded by :attr:`read_timeout`: once
    the server has sent nothing for that long while a statement, a commit or a pipeline waits
    for it, the socket is shut down. The wait then fails at once with
    :class:`psycopg.OperationalError` and the connection is broken, so the pool discards it.

    A half-open link (data stops, the socket stays open: a peer gone behind a NAT or a proxy
    that still acknowledges) otherwise leaves a read waiting for good: libpq has no read
    timeout, and TCP keepalives or ``tcp_user_timeout`` see nothing wrong while something
    acknowledges. Shutting the socket down ends the wait from the outside, in whatever state
    the connection was (cancelling the coroutine would make psycopg send a cancel request and
    wait again on the same silent link). A commit cut this way has an unknown outcome: the
    caller retries, and the inbox's dedupe records or the relay's claims decide.

    The bound counts silence, not the whole operation: a pipeline whose results keep coming is
    never cut. Waits that bound themselves (``notifies(timeout=…)``) are left alone."""

    #: Seconds of silence from the server before the connection is given up; None: no bound.
    read_timeout: float | None = None

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = _WAIT_INTERVAL,
        timeout: float | None = None,  # noqa: ASYNC109 - psycopg's signature
    ) -> RV:
        bound = self.read_timeout
        if bound is None or timeout is not None:
            return await super().wait(gen, interval, timeout)
        watch = _SilenceWatch(self, bound)
        try:
            return await super().wait(watch.watched(gen), interval)
        except psycopg.OperationalError as exc:
            if watch.fired:
                raise psycopg.OperationalError(
                    f"PostgreSQL sent nothing for {bound:g} s (OUTBOXKIT_DATABASE_TIMEOUT): "
                    "connection closed"
                ) from exc
            raise
        finally:
            watch.stop()


class _SilenceWatch:
    """Shuts ``conn``'s socket down once nothing has been read or written for ``bound``
    seconds during one wait."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], bound: float) -> None:
        self._conn = conn
        self._bound = bound
        self._heard = time.monotonic()
        self.fired = False
        self._timer = asyncio.get_running_loop().call_later(bound, self._check)

    def watched(self, gen: PQGen[RV]) -> PQGen[RV]:
        """``gen``, noting every time the socket was ready (``wait`` also resumes it with
        nothing ready, every ``interval``)."""
        try:
            state = next(gen)
            while True:
                ready = yield state
                if ready:
                    self._heard = time.monotonic()
                state = gen.send(ready)
        except StopIteration as stop:
            result: RV = stop.value
            return result

    def _check(self) -> None:
        silent = time.monotonic() - self._heard
        if silent < self._bound:
            self._timer = asyncio.get_running_loop().call_later(self._bound - silent, self._check)
            return
        self.fired = True
        try:
            # A duplicate descriptor of the same socket: shutdown acts on the socket, so the
            # wait's reader sees end-of-file at once; closing the duplicate leaves libpq's.
            with socket.socket(fileno=os.dup(self._conn.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, psycopg.OperationalError):  # already closed: the wait fails anyway
            pass

    def stop(self) -> None:
        self._timer.cancel()


Pool = AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]

#: A pooled connection that ran a statement this recently (seconds) is not checked before its
#: next use: the check is a round trip, one more per claim on the relay's hot path (its cost:
#: bench/results/relay.md, "One round trip less per claim"). One idle for longer is checked
#: first: a server restart leaves broken connections behind. A statement on a connection broken
#: meanwhile fails, is retried, and the pool replaces the connection.
CHECK_AFTER_IDLE = 1.0

#: While its database does not answer, a :class:`RecoveringPool` tries a new connection this
#: often (seconds): a refused one costs nothing, and the first that succeeds ends the wait.
PROBE_EVERY = 0.25

#: A pool replaced by a new one is closed in the background; its workers (a connection attempt
#: in progress) get this long to stop.
_REPLACED_POOL_GRACE = 1.0

_last_used: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
    weakref.WeakKeyDictionary()
)

#: Called with the pool whose check found a connection broken.
OnBroken = Callable[[Pool], Awaitable[None]]


def make_pool(
    url: str,
    *,
    size: int,
    connect_timeout: float,
    name: str,
    statement_timeout: float = 30.0,
    application_name: str | None = None,
    custom_plans: bool = False,
    read_timeout: float | None = None,
    on_broken: OnBroken | None = None,
) -> Pool:
    """A closed pool of autocommit connections, each checked before use unless it ran a
    statement within :data:`CHECK_AFTER_IDLE` (a server restart leaves broken connections
    behind). Open it with ``await pool.open(wait=False)``; :class:`RecoveringPool` makes and
    replaces them.

    ``statement_timeout`` bounds every statement: one that runs away (a bad plan, a lock held
    by someone else) fails and is retried instead of freezing its caller without a word.
    ``application_name`` (``name``, dots as dashes, unless given) tells the connections apart in
    ``pg_stat_activity`` (``outboxkit-relay``, ``outboxkit-inbox``, …). ``custom_plans`` plans
    every execution of a prepared statement for its parameters and the tables as they are now
    (``plan_cache_mode=force_custom_plan``): for statements whose best plan depends on how full a
    table is, a generic plan cached while it was empty can be ruinous once it is not.
    ``read_timeout`` bounds every wait for the server (:class:`BoundedConnection`).
    ``on_broken`` is awaited when a check fails, before the pool discards the connection."""

    async def configure(conn: psycopg.AsyncConnection[TupleRow]) -> None:
        if isinstance(conn, BoundedConnection):
            conn.read_timeout = read_timeout

    async def check(conn: psycopg.AsyncConnection[TupleRow]) -> None:
        used = _last_used.get(conn)
        if used is not None and time.monotonic() - used < CHECK_AFTER_IDLE:
            return
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception:
            if on_broken is not None:
                await on_broken(pool)
            raise

    pool: Pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=size,
        open=False,
        kwargs={
            "autocommit": True,
            "connect_timeout": max(1, round(connect_timeout)),
            "options": f"-c statement_timeout={int(statement_timeout * 1000)}"
            + (" -c plan_cache_mode=force_custom_plan" if custom_plans else ""),
            "application_name": application_name or name.replace(".", "-"),
        },
        connection_class=BoundedConnection,
        configure=configure if read_timeout is not None else None,
        check=check,
        timeout=connect_timeout,
        name=name,
    )
    return pool


class RecoveringPool:
    """A pool (:func:`make_pool`) that is back at full speed as soon as its database answers
    again after a restart or a failover.

    psycopg_pool on its own is slow to come back. It lends its oldest idle connection first
    and checks it, and between two failed checks it waits 0, 1, 2, 4 s…: after a restart every
    idle connection is dead, and the new good ones queue behind them. And it re-adds a lost
    connection with a backoff of its own (1, 2, 4, 8 s… between attempts), so after an outage
    of *t* seconds its next attempt may come up to *t* seconds after the database answers.
    Measured on an inbox worker of 24 partitions: 3 to 17 s idle after the database answered.

    So a connection that fails for the server's sake (a failed check, a connection error, no
    connection within ``connect_timeout``) makes its idle siblings suspect: they are dropped at
    once (``drain``), and a probe tries a new connection every :data:`PROBE_EVERY` until one
    succeeds. Then the pool is replaced by a new one, whose first connection is made at once;
    whoever waited on the old pool gets a connection of the new one. :meth:`unanswered_for` says
    how long the database has not answered (for health probes). A statement cancelled by
    ``statement_timeout`` is not the server's fault and changes nothing."""

    def __init__(self, url: str, *, connect_timeout: float, name: str, **options: Any) -> None:
        self._url = url
        self._connect_timeout = connect_timeout
        self._name = name
        self._options = options
        self._pool = self._new_pool()
        self._unanswered_since: float | None = None
        self._probe: asyncio.Task[None] | None = None
        self._replaced: set[asyncio.Task[None]] = set()
        #: How many times the pool was replaced after its database answered again.
        self.renewals = 0

    def _new_pool(self) -> Pool:
        return make_pool(
            self._url,
            connect_timeout=self._connect_timeout,
            name=self._name,
            on_broken=self._broken,
            **self._options,
        )

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await asyncio.gather(*self._replaced, return_exceptions=True)
        await self._pool.close()

    def unanswered_for(self) -> float | None:
        """Seconds since a connection failed for the server's sake, while no new one has
        succeeded since; None while the database answers."""
        since = self._unanswered_since
        return None if since is None else time.monotonic() - since

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection (committed or rolled back on exit, as psycopg_pool's own).
        Raises what psycopg and psycopg_pool raise."""
        conn, pool = await self._getconn()
        try:
            async with conn:
                yield conn
            _last_used[conn] = time.monotonic()
        except psycopg.OperationalError as exc:
            if not isinstance(exc, psycopg.errors.QueryCanceled):
                self._unanswered()
            raise
        finally:
            await pool.putconn(conn)

    async def _getconn(self) -> tuple[psycopg.AsyncConnection[TupleRow], Pool]:
        pool = self._pool
        try:
            return await pool.getconn(), pool
        except (PoolTimeout, PoolClosed):
            if pool is self._pool:  # not replaced while this waited
                if not pool.closed:
                    self._unanswered()
                raise
        pool = self._pool  # the database answered meanwhile: its new pool
        return await pool.getconn(), pool

    async def _broken(self, pool: Pool) -> None:
        """A check found one of ``pool``'s connections broken: drop its idle siblings now."""
        if pool is self._pool:
            await pool.drain()
            self._unanswered()

    def _unanswered(self) -> None:
        if self._unanswered_since is None:
            self._unanswered_since = time.monotonic()
        if self._probe is None and not self._pool.closed:
            self._probe = asyncio.create_task(self._until_answered(), name=f"{self._name} probe")

    async def _until_answered(self) -> None:
        """Try a new connection every :data:`PROBE_EVERY` until one succeeds; then replace the
        pool."""
        try:
            while True:
                try:
                    conn = await connect_session(
                        self._url,
                        application_name=f"{self._name.replace('.', '-')}-probe",
                        connect_timeout=self._connect_timeout,
                    )
                except psycopg.OperationalError:
                    await asyncio.sleep(PROBE_EVERY)
                    continue
                await conn.close()
                break
            old, self._pool = self._pool, self._new_pool()
            await self._pool.open()
            self.renewals += 1
            self._unanswered_since = None
            closing = asyncio.create_task(old.close(timeout=_REPLACED_POOL_GRACE))
            self._replaced.add(closing)
            closing.add_done_callback(self._replaced.discard)
        finally:
            self._probe = None


async def connect_session(
    url: str,
    *,
    application_name: str,
    connect_timeout: float,
    read_timeout: float | None = None,
) -> psycopg.AsyncConnection[Any]:
    """One autocommit connection outside the pool, for what lives as long as a session does
    (``LISTEN``, a session-level advisory lock): never through a pooler in transaction mode.
    ``read_timeout`` bounds every wait for the server (:class:`BoundedConnection`)."""
    conn = await BoundedConnection.connect(
        url,
        autocommit=True,
        connect_timeout=max(1, round(connect_timeout)),
        application_name=application_name,
    )
    conn.read_timeout = read_timeout
    return conn


@asynccontextmanager
async def connection(
    pool: RecoveringPool, unavailable: type[OutboxkitError]
) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
    """A pooled connection; an unreachable server surfaces as ``unavailable`` (retriable)."""
    try:
        async with pool.connection() as conn:
            yield conn
    except (psycopg.OperationalError, psycopg.errors.QueryCanceled, PoolTimeout) as exc:
        raise unavailable(f"PostgreSQL is unavailable: {exc}") from exc


class PooledStore:
    """Base of outboxkit's PostgreSQL stores: a :class:`RecoveringPool` opened and closed with
    ``async with``, and connections whose failures surface as the store's own retriable error."""

    unavailable: type[OutboxkitError]

    def __init__(
        self,
        url: str,
        *,
        pool_size: int,
        connect_timeout: float,
        name: str,
        application_name: str | None = None,
        custom_plans: bool = False,
        read_timeout: float | None = None,
    ) -> None:
        self._pool = RecoveringPool(
            url,
            size=pool_size,
            connect_timeout=connect_timeout,
            name=name,
            application_name=application_name,
            custom_plans=custom_plans,
            read_timeout=read_timeout,
        )

    async def __aenter__(self) -> Self:
        await self._pool.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._close_own_connections()
        finally:
            await self._pool.close()

    def unanswered_for(self) -> float | None:
        """Seconds the database has not answered this store's pool (a connection failed for
        the server's sake, and no new one could be made since); None while it answers."""
        return self._pool.unanswered_for()

    async def _close_own_connections(self) -> None:
        """Close what a store holds beside the pool (a dedicated session), before the pool."""

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[TupleRow]]:
        return connection(self._pool, self.unavailable)
