"""Limits enforced where they can still be refused (G8, issue #26): a writer refuses, inside the
caller's transaction, an event the relay could never publish; and no relay query grows with the
data (MongoDB refuses any command over 16 MB)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from outboxkit.backends import Transactions
from outboxkit.core.mongodb import database_name
from outboxkit.relay import (
    EventTooLargeError,
    MongoOutboxStorage,
    OutboxStorage,
    RelaySettings,
    TopicPartition,
)
from outboxkit.relay.limits import MAX_KEY_BYTES, MAX_RECORD_BYTES
from outboxkit.relay.mongodb.writer import MongoOutbox
from outboxkit.schemas import Event
from tests.integration.backends import BackendCase

TOPIC = "limits"
TP0 = TopicPartition(TOPIC, 0)


class Blob(Event, type="limits.blob", topic=TOPIC, key_field="entity"):
    entity: str
    blob: str = ""


@pytest.fixture
async def parts(backend_case: BackendCase) -> AsyncIterator[tuple[OutboxStorage, Transactions]]:
    settings = RelaySettings(database_url=backend_case.url, topics=[TOPIC])
    backend = backend_case.backend
    async with (
        backend.relay(settings) as (storage, _),
        backend.transactions(source="urn:test", pool_size=1, connect_timeout=5) as tx,
    ):
        await storage.register_topics({TOPIC: 1})
        yield storage, tx


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (Blob(entity="k" * (MAX_KEY_BYTES + 1)), "its key is 4097 bytes"),
        (Blob(entity="a", blob="x" * MAX_RECORD_BYTES), "its Kafka record would be"),
    ],
    ids=["key", "record"],
)
async def test_an_event_the_relay_could_never_publish_is_refused_in_the_transaction(
    parts: tuple[OutboxStorage, Transactions], event: Blob, message: str
) -> None:
    storage, tx = parts

    async def write() -> None:
        async with tx.transaction() as t:
            await tx.outbox.add(t, Blob(entity="b", blob="fine"))
            await tx.outbox.add(t, event)

    with pytest.raises(EventTooLargeError, match=message):
        await write()
    assert await storage.settle_and_claim([TP0], 10) == [], "the whole transaction rolled back"
    async with tx.transaction() as t:  # the largest that fits is accepted
        await tx.outbox.add(t, Blob(entity="k" * MAX_KEY_BYTES, blob="x" * 900_000))
    [record] = await storage.settle_and_claim([TP0], 10)
    assert len(record.key) == MAX_KEY_BYTES


async def test_parked_keys_over_16_mb_do_not_stop_the_mongodb_head_read(
    migrated_mongodb_url: str,
) -> None:
    """4,200 parked records with 4 KiB keys: 17 MB of keys, which 4bac9f4 put in the head
    read's `$nin` (pymongo's DocumentTooLarge, and the relay died). Other keys still come."""
    url = migrated_mongodb_url
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, uuidRepresentation="standard")
    outbox = client.get_database(database_name(url)).get_collection("outboxkit.outbox")
    now = datetime.now(UTC)

    def record(key: bytes, position: int, state: str) -> dict[str, Any]:
        return {
            "topic": TOPIC,
            "partition": 0,
            "position": position,
            "previous": None,
            "key": key,
            "value": b"{}",
            "headers": [],
            "event_id": uuid.uuid4(),
            "event_type": "limits.blob",
            "created_at": now,
            "state": state,
            "attempts": 5,
        }

    parked = [record(f"{i:06d}".encode() * (MAX_KEY_BYTES // 6), i, "failed") for i in range(4200)]
    fine = [record(f"ok-{i}".encode(), 10_000 + i, "pending") for i in range(20)]
    try:
        for start in range(0, len(parked), 500):
            await outbox.insert_many(parked[start : start + 500])
        await outbox.insert_many(fine)
        async with MongoOutboxStorage(url) as storage:
            found = await storage.settle_and_claim([TP0], 50)
    finally:
        await client.close()
    assert sorted(r.key for r in found) == sorted(r["key"] for r in fine)


async def test_a_mongodb_writer_works_with_the_callers_default_client(
    migrated_mongodb_url: str,
) -> None:
    """A service's own `AsyncMongoClient(url)` has no UUID representation configured (pymongo's
    default): the writer still adds events, and the relay reads their ids (#28)."""
    url = migrated_mongodb_url
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)  # no uuidRepresentation
    outbox = MongoOutbox(source="urn:test", database=database_name(url))
    event = Blob(entity="a")
    try:
        async with MongoOutboxStorage(url) as storage:
            await storage.register_topics({TOPIC: 1})
            async with client.start_session() as session:

                async def write(s: Any) -> None:
                    await outbox.add(s, event)

                await session.with_transaction(write)
            [record] = await storage.settle_and_claim([TP0], 10)
    finally:
        await client.close()
    assert record.event_id == event.id
