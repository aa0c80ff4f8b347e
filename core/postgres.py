"""Connection pools for outboxkit's own PostgreSQL queries (the relay's and the inbox's)."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from outboxkit.core.exceptions import OutboxkitError

Pool = AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]

#: A pooled connection that ran a statement this recently (seconds) is not checked before its
#: next use: the check is a round trip, one more per claim on the relay's hot path (its cost:
#: docs/relay.md, "One round trip less per claim"). One idle for longer is checked first: a
#: server restart leaves broken connections behind. A statement on a connection broken
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
    table is, a generic plan cached while it was empty can be ruinous once it is not."""
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
        check=_check_if_idle,
        timeout=connect_timeout,
        name=name,
    )


async def connect_session(
    url: str, *, application_name: str, connect_timeout: float
) -> psycopg.AsyncConnection[Any]:
    """One autocommit connection outside the pool, for what lives as long as a session does
    (``LISTEN``, a session-level advisory lock): never through a pooler in transaction mode."""
    return await psycopg.AsyncConnection.connect(
        url,
        autocommit=True,
        connect_timeout=max(1, round(connect_timeout)),
        application_name=application_name,
    )


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
    ) -> None:
        self._pool = make_pool(
            url,
            size=pool_size,
            connect_timeout=connect_timeout,
            name=name,
            application_name=application_name,
            custom_plans=custom_plans,
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
