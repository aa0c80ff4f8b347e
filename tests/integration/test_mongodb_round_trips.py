"""Round trips #27 cut on MongoDB, and the guarantees they keep: the writer reads partition
counts once per ``partitions_ttl``, not in every transaction (that read was one of its four
round trips); the claim settles the last batch beside its read of the next."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from outboxkit.core.mongodb import database_name, in_transaction
from outboxkit.relay import (
    MongoOutbox,
    MongoOutboxStorage,
    StorageUnavailableError,
    TopicPartition,
    UnknownTopicError,
)
from outboxkit.schemas import Event, partition_for_key

TOPIC = "orders"


class Placed(Event, type="writer.placed", topic=TOPIC, key_field="order"):
    order: str


class TopicReads(monitoring.CommandListener):
    """Counts the commands that read ``outboxkit.topics``."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "find" and event.command.get("find") == "outboxkit.topics":
            self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def _partitions_written(url: str, outbox: MongoOutbox, orders: list[str]) -> list[int]:
    reads = TopicReads()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        url, uuidRepresentation="standard", event_listeners=[reads]
    )
    try:
        for order in orders:

            async def write(session: Any, order: str = order) -> None:
                await outbox.add(session, Placed(order=order))

            await in_transaction(client, write, unavailable=StorageUnavailableError)
        db = client.get_database(database_name(url))
        docs = db.get_collection("outboxkit.outbox").find({}, {"partition": True, "key": True})
        by_key = {bytes(doc["key"]).decode(): doc["partition"] async for doc in docs}
        return [by_key[order] for order in orders] + [reads.count]
    finally:
        await client.close()


async def test_partition_counts_are_read_once_per_ttl(migrated_mongodb_url: str) -> None:
    """Ten transactions read the topics once; a count registered meanwhile is used once the
    writer's copy is older than its TTL (here 0: at once), never before."""
    url = migrated_mongodb_url
    # Keys whose partition differs between 1 and 8 partitions.
    orders = [o for o in (f"o{i}" for i in range(100)) if partition_for_key(o, 8) != 0][:10]
    cached = MongoOutbox(source="urn:test", database=database_name(url), partitions_ttl=3600)
    async with MongoOutboxStorage(url) as storage:
        await storage.register_topics({TOPIC: 1})
        *partitions, reads = await _partitions_written(url, cached, orders)
        assert (partitions, reads) == ([0] * 10, 1)

        await storage.register_topics({TOPIC: 8})  # the topic grew
        *partitions, reads = await _partitions_written(url, cached, ["stale"])
        assert (partitions, reads) == ([0], 0)  # within the TTL: the count it read

        fresh = MongoOutbox(source="urn:test", database=database_name(url), partitions_ttl=0)
        *partitions, reads = await _partitions_written(url, fresh, ["p1", "p2"])
        assert partitions == [partition_for_key("p1", 8), partition_for_key("p2", 8)]
        assert reads == 2


async def test_an_unknown_topic_is_not_remembered(migrated_mongodb_url: str) -> None:
    """A refused topic is read again in the next transaction: once registered, it is written."""
    url = migrated_mongodb_url
    outbox = MongoOutbox(source="urn:test", database=database_name(url), partitions_ttl=3600)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, uuidRepresentation="standard")

    async def write(session: Any) -> None:
        await outbox.add(session, Placed(order="a"))

    try:
        with pytest.raises(UnknownTopicError, match="outboxkit topics sync"):
            await in_transaction(client, write, unavailable=StorageUnavailableError)
        async with MongoOutboxStorage(url) as storage:
            await storage.register_topics({TOPIC: 3})
        await in_transaction(client, write, unavailable=StorageUnavailableError)
    finally:
        await client.close()


async def test_the_settle_runs_beside_the_next_read_and_a_failed_one_returns_nothing(
    migrated_mongodb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim settles the last batch while it reads the next heads (two round trips at
    once), leaving out the records being settled, which it may still see pending: a key's next
    record comes in the same claim. A settle that fails fails the claim with the relay's
    retriable error (not an exception group) and returns nothing to publish, so no record goes
    out before its predecessor is settled (G2)."""
    url = migrated_mongodb_url
    outbox = MongoOutbox(source="urn:test", database=database_name(url))
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, uuidRepresentation="standard")
    try:
        async with MongoOutboxStorage(url) as storage:
            await storage.register_topics({TOPIC: 1})
            for order in ["a", "a", "b"]:

                async def write(session: Any, order: str = order) -> None:
                    await outbox.add(session, Placed(order=order))

                await in_transaction(client, write, unavailable=StorageUnavailableError)
            tp = [TopicPartition(TOPIC, 0)]
            first = await storage.settle_and_claim(tp, 10, depth=1)
            assert [r.key for r in first] == [b"a", b"b"]

            async def unavailable(*args: Any, **kwargs: Any) -> None:
                raise StorageUnavailableError("the primary stepped down")

            with monkeypatch.context() as patched:
                patched.setattr(storage, "_settle", unavailable)
                with pytest.raises(StorageUnavailableError):
                    await storage.settle_and_claim(tp, 10, published=first, depth=1)
            second = await storage.settle_and_claim(tp, 10, published=first, depth=1)
            assert [r.key for r in second] == [b"a"]
            assert second[0].id not in {r.id for r in first}
            assert await storage.settle_and_claim(tp, 10, published=second, depth=1) == []
    finally:
        await client.close()
