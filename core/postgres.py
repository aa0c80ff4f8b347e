"""Connection pools for outboxkit's own PostgreSQL queries (the relay's and the inbox's)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

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

_last_used: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
    weakref.WeakKeyDictionary()
)


async def _check_if_idle(conn: psycopg.AsyncConnection[Any]) -> None:
    used = _last_used.get(conn)
    if used is None or time.monotonic() - used >= CHECK_AFTER_IDLE:
        await AsyncConnectionPool.check_connection(conn)


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
) -> Pool:
    """A closed pool of autocommit connections, each checked before use unless it ran a
    statement within :data:`CHECK_AFTER_IDLE` (a server restart leaves broken connections
    behind). Open it with ``await pool.open(wait=False)``.

    ``statement_timeout`` bounds every statement: one that runs away (a bad plan, a lock held
    by someone else) fails and is retried instead of freezing its caller without a word.
    ``application_name`` (``name``, dots as dashes, unless given) tells the connections apart in
    ``pg_stat_activity`` (``outboxkit-relay``, ``outboxkit-inbox``, …). ``custom_plans`` plans
    every execution of a prepared statement for its parameters and the tables as they are now
    (``plan_cache_mode=force_custom_plan``): for statements whose best plan depends on how full a
    table is, a generic plan cached while it was empty can be ruinous once it is not.
    ``read_timeout`` bounds every wait for the server (:class:`BoundedConnection`)."""

    async def configure(conn: psycopg.AsyncConnection[TupleRow]) -> None:
        if isinstance(conn, BoundedConnection):
            conn.read_timeout = read_timeout

    return AsyncConnectionPool(
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
        check=_check_if_idle,
        timeout=connect_timeout,
        name=name,
    )


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
    pool: Pool, unavailable: type[OutboxkitError]
) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
    """A pooled connection; an unreachable server surfaces as ``unavailable`` (retriable)."""
    try:
        async with pool.connection() as conn:
            yield conn
            _last_used[conn] = time.monotonic()
    except (psycopg.OperationalError, psycopg.errors.QueryCanceled, PoolTimeout) as exc:
        raise unavailable(f"PostgreSQL is unavailable: {exc}") from exc


class PooledStore:
    """Base of outboxkit's PostgreSQL stores: a pool opened and closed with ``async with``,
    and connections whose failures surface as the store's own retriable error."""

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
        self._pool = make_pool(
            url,
            size=pool_size,
            connect_timeout=connect_timeout,
            name=name,
            application_name=application_name,
            custom_plans=custom_plans,
            read_timeout=read_timeout,
        )

    async def __aenter__(self) -> Self:
        await self._pool.open(wait=False)
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

    async def _close_own_connections(self) -> None:
        """Close what a store holds beside the pool (a dedicated session), before the pool."""

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[TupleRow]]:
        return connection(self._pool, self.unavailable)
