"""PostgreSQL implementation of :class:`~outboxkit.inbox.store.InboxStore`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import psycopg

from outboxkit.core.pg import PooledStore
from outboxkit.core.sql import load_queries
from outboxkit.inbox.exceptions import InboxStorageUnavailableError
from outboxkit.inbox.store import BatchOutcome, Delivery

_QUERIES = load_queries("outboxkit.inbox.postgres", "queries.sql")


class PostgresInboxStore(PooledStore):
    """Use as ``async with PostgresInboxStore(url) as store:``."""

    unavailable = InboxStorageUnavailableError

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout: float = 10.0) -> None:
        super().__init__(
            url, pool_size=pool_size, connect_timeout=connect_timeout, name="outboxkit-inbox"
        )

    async def process_batch(self, consumer: str, deliveries: Sequence[Delivery]) -> BatchOutcome:
        """Optimistically: one statement claims the whole batch, then the new events' handlers
        run without savepoints, their statements pipelined (no round trip each), and one commit.
        If a handler raises, that transaction rolls back and the batch is redone with a savepoint
        per delivery, which gives the exact prefix that commits and the delivery that failed."""
        if len(deliveries) > 1:
            try:
                return await self._process_optimistically(consumer, deliveries)
            except (psycopg.OperationalError, InboxStorageUnavailableError):
                raise  # the connection is gone: nothing of this batch committed
            except Exception:  # a handler raised: find out which, below
                pass
        return await self._process_with_savepoints(consumer, deliveries)

    async def _process_optimistically(
        self, consumer: str, deliveries: Sequence[Delivery]
    ) -> BatchOutcome:
        # Pipeline mode throughout: BEGIN and the claim go in one round trip, the handlers'
        # statements are sent without waiting for each result, and COMMIT follows them; an error
        # surfaces at the latest when the pipeline syncs, before the transaction commits.
        ids = [str(d.event.id) for d in deliveries]
        async with self._connection() as conn, conn.pipeline(), conn.transaction():
            cur = await conn.execute(*_claim_batch(consumer, deliveries, ids))
            new = {row[0] for row in await cur.fetchall()}
            ran = []
            for d, event_id in zip(deliveries, ids, strict=True):
                first = event_id in new
                if first:
                    new.discard(event_id)  # a second copy in the batch is a duplicate
                    await d.handler(d.event, conn)
                ran.append(first)
        return BatchOutcome(ran=ran)

    async def _process_with_savepoints(
        self, consumer: str, deliveries: Sequence[Delivery]
    ) -> BatchOutcome:
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


def _claim_batch(
    consumer: str, deliveries: Sequence[Delivery], ids: Sequence[str]
) -> tuple[str, dict[str, object]]:
    """The claim statement for ``deliveries`` (whose event ids are ``ids``, as text) and its
    parameters. The columns go as array literals (one text parameter each, which PostgreSQL
    parses) rather than Python lists (which psycopg adapts element by element)."""
    first = deliveries[0]
    params: dict[str, object] = {
        "consumer": consumer,
        "event_ids": "{" + ",".join(ids) + "}",
        "event_types": _text_array([d.event.event_type for d in deliveries]),
        "offsets": "{" + ",".join([str(d.offset) for d in deliveries]) + "}",
    }
    if all(d.partition == first.partition and d.topic == first.topic for d in deliveries):
        params.update(topic=first.topic, partition=first.partition)
        return _QUERIES["claim_partition_events"], params
    params.update(
        topics=_text_array([d.topic for d in deliveries]),
        partitions="{" + ",".join([str(d.partition) for d in deliveries]) + "}",
    )
    return _QUERIES["claim_events"], params


def _text_array(values: Sequence[str]) -> str:
    """A PostgreSQL array literal of ``values``: each element quoted, ``\\`` and ``"`` escaped."""
    return "{" + ",".join(['"' + _escape(v) + '"' for v in values]) + "}"


def _escape(value: str) -> str:
    if "\\" not in value and '"' not in value:
        return value
    return value.replace("\\", "\\\\").replace('"', '\\"')
