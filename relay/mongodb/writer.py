"""The service side on MongoDB: add events to the outbox inside the caller's own transaction."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from bson import Binary
from pymongo.asynchronous.client_session import AsyncClientSession

from outboxkit.core.mongodb import Document, collection, require_transaction
from outboxkit.relay.exceptions import NotInTransactionError, UnknownTopicError
from outboxkit.relay.limits import MAX_KEY_BYTES, MAX_RECORD_BYTES, check_size
from outboxkit.relay.mongodb.positions import take_positions
from outboxkit.schemas import EncodedEvent, Event, check_source, encode, partition_for_key

#: Seconds a writer keeps the partition counts it read from ``outboxkit.topics``: reading them
#: in every transaction was one of its four round trips. Counts change only when a topic
#: grows, which reorders a key across the change anyway (docs/relay.md); a writer takes the
#: new count at most this long after the relay registers it.
PARTITIONS_TTL = 10.0


class MongoOutbox:
    """Writes events as outbox documents with the caller's session, in the caller's transaction.

    Nothing is committed here: the documents become visible to the relay when the caller
    commits, and vanish if it aborts. ``database`` is the one holding outboxkit's collections
    (the path of ``OUTBOXKIT_DATABASE_URL``)::

        outbox = MongoOutbox(source="urn:service:orders", database="shop")

        async def place(session: AsyncClientSession) -> None:
            await orders.insert_one({...}, session=session)
            await outbox.add(session, OrderPlaced(order_id=…, customer_id=…))

        async with client.start_session() as session:
            await session.with_transaction(place)

    ``with_transaction`` matters: two transactions that add events of the same key conflict,
    and MongoDB makes one of them retry (that is what keeps a key's events in commit order).

    Each topic's partition count is read once per ``partitions_ttl`` seconds
    (:data:`PARTITIONS_TTL`), not in every transaction.
    """

    def __init__(
        self,
        *,
        source: str,
        database: str,
        max_key_bytes: int = MAX_KEY_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
        partitions_ttl: float = PARTITIONS_TTL,
    ) -> None:
        check_source(source)  # a URI-reference, as CloudEvents requires (the error says how)
        if not database:
            raise ValueError("database must name the MongoDB database of outboxkit's collections")
        self.source = source
        self.database = database
        self.max_key_bytes = max_key_bytes
        self.max_record_bytes = max_record_bytes
        self.partitions_ttl = partitions_ttl
        #: topic → (partition count, time.monotonic() when read)
        self._partitions: dict[str, tuple[int, float]] = {}

    async def add(self, session: AsyncClientSession, event: Event) -> None:
        await self.add_many(session, [event])

    async def add_many(self, session: AsyncClientSession, events: Iterable[Event]) -> None:
        """Add ``events`` in order: one or two round trips for the keys' positions, one insert
        of all documents (and a read of the topics when their partition counts are not known
        from the last ``partitions_ttl`` seconds)."""
        encoded = [(event, encode(event, source=self.source)) for event in events]
        if not encoded:
            return
        for event, wire in encoded:
            check_size(
                wire,
                event.id,
                max_key_bytes=self.max_key_bytes,
                max_record_bytes=self.max_record_bytes,
            )
        session = require_transaction(session, NotInTransactionError)
        db = session.client.get_database(self.database)
        partitions = await self._partition_counts(db, session, {wire.topic for _, wire in encoded})
        counts = Counter((wire.topic, wire.key) for _, wire in encoded)
        spans = await take_positions(collection(db, "keys"), session, counts)
        taken: Counter[tuple[str, bytes]] = Counter()
        now = datetime.now(UTC)
        documents = []
        for event, wire in encoded:
            span = spans[wire.topic, wire.key]
            index = taken[wire.topic, wire.key]
            taken[wire.topic, wire.key] += 1
            position, previous = span.first + index, span.previous_of(index)
            documents.append(
                record_document(event, wire, partitions[wire.topic], position, previous, now=now)
            )
        outbox = collection(db, "outbox")
        if len(documents) == 1:  # the usual add(): insert_one costs the client less
            await outbox.insert_one(documents[0], session=session)
        else:
            await outbox.insert_many(documents, session=session)

    async def _partition_counts(
        self, db: Any, session: AsyncClientSession, topics: set[str]
    ) -> dict[str, int]:
        now = time.monotonic()
        known = {
            topic: entry[0]
            for topic in topics
            if (entry := self._partitions.get(topic)) is not None
            and now - entry[1] < self.partitions_ttl
        }
        if len(known) == len(topics):
            return known
        found = {
            doc["_id"]: int(doc["partitions"])
            async for doc in collection(db, "topics").find(
                {"_id": {"$in": sorted(topics - set(known))}}, session=session
            )
        }
        missing = sorted(topics - set(known) - set(found))
        if missing:
            raise UnknownTopicError(
                f"topic(s) {', '.join(missing)} not registered in outboxkit.topics, so their "
                "partitions are unknown: start the relay with them in OUTBOXKIT_TOPICS (it "
                "registers them from Kafka's metadata), or run `outboxkit topics sync`. Abort "
                "this transaction."
            )
        for topic, count in found.items():
            self._partitions[topic] = (count, now)
        return known | found


def record_document(
    event: Event,
    wire: EncodedEvent,
    partitions: int,
    position: int,
    previous: int | None,
    *,
    now: datetime,
) -> Document:
    """The outbox document of ``event`` at ``position`` in its key's order, right after
    ``previous`` (:mod:`.positions`)."""
    return {
        "topic": wire.topic,
        # Fixed at write time, like on PostgreSQL: every record of a key stays in one
        # partition (and one relay's hands) even if the topic later grows.
        "partition": partition_for_key(wire.key, partitions),
        "position": position,
        "previous": previous,
        "key": wire.key,
        "value": wire.value,
        "headers": [[name, value] for name, value in wire.headers],
        # As a UUID binary of its own (subtype 4): the caller's client may have no UUID
        # representation configured (pymongo's default), and the relay's reads it as a UUID.
        "event_id": Binary.from_uuid(event.id),
        "event_type": event.event_type,
        "created_at": now,
        "state": "pending",
        "attempts": 0,
    }
