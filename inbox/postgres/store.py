"""PostgreSQL implementation of :class:`~outboxkit.inbox.store.InboxStore`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import psycopg

from outboxkit.inbox.exceptions import InboxStorageUnavailableError
from outboxkit.inbox.store import BatchOutcome, Delivery
from outboxkit.pg import PooledStore
from outboxkit.sql import load_queries

_QUERIES = load_queries("outboxkit.inbox.postgres", "queries.sql")


class PostgresInboxStore(PooledStore):
    """Use as ``async with PostgresInboxStore(url) as store:``."""

    unavailable = InboxStorageUnavailableError

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout: float = 10.0) -> None:
        super().__init__(
            url, pool_size=pool_size, connect_timeout=connect_timeout, name="outboxkit-inbox"
        )

    async def process_batch(self, consumer: str, deliveries: Sequence[Delivery]) -> BatchOutcome:
        outcome = BatchOutcome()
        async with self._connection() as conn, conn.transaction():
            for index, d in enumerate(deliveries):
                try:
                    async with conn.transaction():  # a savepoint per delivery
                        cur = await conn.execute(
                            _QUERIES["claim_event"], _claim_params(consumer, d)
                        )
                        if cur.rowcount:
                            await d.handler(d.event, conn)
                except psycopg.OperationalError:
                    raise  # the connection is gone: nothing of this batch committed
                except Exception as exc:
                    outcome.failed = (index, exc)
                    break
                outcome.ran.append(bool(cur.rowcount))
        return outcome

    async def purge(self, older_than: timedelta, limit: int) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["purge"], {"older_than": older_than, "limit": limit})
            return cur.rowcount

    async def count(self, consumer: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["count"], {"consumer": consumer})
            row = await cur.fetchone()
            return int(row[0]) if row else 0


def _claim_params(consumer: str, d: Delivery) -> dict[str, object]:
    return {
        "consumer": consumer,
        "event_id": d.event.id,
        "event_type": d.event.event_type,
        "topic": d.topic,
        "partition": d.partition,
        "offset": d.offset,
    }
