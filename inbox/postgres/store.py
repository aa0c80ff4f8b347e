"""PostgreSQL implementation of :class:`~outboxkit.inbox.store.InboxStore`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Self

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from outboxkit.inbox.exceptions import InboxStorageUnavailableError
from outboxkit.inbox.handlers import Handler
from outboxkit.schemas import Event
from outboxkit.sql import load_queries

_QUERIES = load_queries("outboxkit.inbox.postgres", "queries.sql")


class PostgresInboxStore:
    """Use as ``async with PostgresInboxStore(url) as store:``."""

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout: float = 10.0) -> None:
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(connect_timeout))},
            check=AsyncConnectionPool.check_connection,
            timeout=connect_timeout,
            name="outboxkit-inbox",
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
        await self._pool.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise InboxStorageUnavailableError(f"PostgreSQL is unavailable: {exc}") from exc

    async def process(
        self,
        consumer: str,
        event: Event,
        handler: Handler,
        *,
        topic: str,
        partition: int,
        offset: int,
    ) -> bool:
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(
                _QUERIES["claim_event"],
                {
                    "consumer": consumer,
                    "event_id": event.id,
                    "event_type": event.event_type,
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                },
            )
            if cur.rowcount == 0:
                return False
            await handler(event, conn)
            return True

    async def purge(self, older_than: timedelta, limit: int) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["purge"], {"older_than": older_than, "limit": limit})
            return cur.rowcount

    async def count(self, consumer: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["count"], {"consumer": consumer})
            row = await cur.fetchone()
            return int(row[0]) if row else 0
