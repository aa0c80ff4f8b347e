"""The service side: add events to the outbox inside the caller's own transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import pq

from outboxkit.core.sql import load_queries
from outboxkit.relay.exceptions import NotInTransactionError, UnknownTopicError
from outboxkit.relay.limits import MAX_KEY_BYTES, MAX_RECORD_BYTES, check_size
from outboxkit.schemas import Event, check_source, encode, murmur2

_QUERIES = load_queries("outboxkit.relay.postgres", "queries.sql")


class PostgresOutbox:
    """Writes events as outbox rows with the caller's connection, in the caller's transaction.

    Nothing is committed here: the rows become visible to the relay when the caller commits,
    and vanish if it rolls back. ``source`` names the producing service (CloudEvents
    ``source``, e.g. ``"urn:service:orders"``)::

        outbox = PostgresOutbox(source="urn:service:orders")
        async with conn.transaction():
            await conn.execute("INSERT INTO orders …")
            await outbox.add(conn, OrderPlaced(order_id=…, customer_id=…))
    """

    def __init__(
        self,
        *,
        source: str,
        max_key_bytes: int = MAX_KEY_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        check_source(source)  # a URI-reference, as CloudEvents requires (the error says how)
        self.source = source
        self.max_key_bytes = max_key_bytes
        self.max_record_bytes = max_record_bytes

    async def add(self, conn: psycopg.AsyncConnection[Any], event: Event) -> None:
        await self.add_many(conn, [event])

    async def add_many(self, conn: psycopg.AsyncConnection[Any], events: Iterable[Event]) -> None:
        """Add ``events`` in order (one round trip: psycopg pipelines the statements)."""
        params = [self._params(event) for event in events]
        if not params:
            return
        if conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
            raise NotInTransactionError
        async with conn.cursor() as cur:
            await cur.executemany(_QUERIES["insert_event"], params)
            if cur.rowcount != len(params):
                await self._raise_unknown_topic(conn, {p["topic"] for p in params})

    def _params(self, event: Event) -> dict[str, Any]:
        wire = encode(event, source=self.source)
        check_size(
            wire,
            event.id,
            max_key_bytes=self.max_key_bytes,
            max_record_bytes=self.max_record_bytes,
        )
        return {
            "topic": wire.topic,
            "key_hash": murmur2(wire.key),
            "key": wire.key,
            "value": wire.value,
            "header_names": [name for name, _ in wire.headers],
            "header_values": [value for _, value in wire.headers],
            "event_id": event.id,
            "event_type": event.event_type,
        }

    @staticmethod
    async def _raise_unknown_topic(conn: psycopg.AsyncConnection[Any], topics: set[str]) -> None:
        cur = await conn.execute(
            "SELECT topic FROM outboxkit.topics WHERE topic = ANY(%s)", (sorted(topics),)
        )
        known = {row[0] for row in await cur.fetchall()}
        missing = ", ".join(sorted(topics - known))
        raise UnknownTopicError(
            f"topic(s) {missing} not registered in outboxkit.topics, so their partitions are "
            "unknown: start the relay with them in OUTBOXKIT_TOPICS (it registers them from "
            "Kafka's metadata), or run `outboxkit topics sync`. Roll back this transaction."
        )
