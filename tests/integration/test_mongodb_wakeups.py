"""The change stream is a wake-up hint that survives its own failures: after an ``invalidate``
(the collection dropped) or an error it reopens, and says "look everywhere" (None) first."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pymongo import AsyncMongoClient

from outboxkit.core.mongodb import database_name
from outboxkit.relay import MongoWakeups, TopicPartition


async def _next(stream: Any, within: float = 10) -> TopicPartition | None:
    async with asyncio.timeout(within):
        return await anext(stream)  # type: ignore[no-any-return]


async def test_inserts_wake_their_partition_and_a_dropped_collection_reopens(
    mongo_url: str,
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    outbox = client.get_database(database_name(mongo_url)).get_collection("wakeups")
    stream = MongoWakeups(outbox).wakeups()
    try:
        assert await _next(stream) is None, "opening says: look everywhere"
        await outbox.insert_one({"topic": "t", "partition": 2, "state": "pending"})
        assert await _next(stream) == TopicPartition("t", 2)
        await outbox.update_one({"partition": 2}, {"$set": {"state": "published"}})
        await outbox.update_one({"partition": 2}, {"$set": {"state": "pending"}})
        assert await _next(stream) is None, "a record pending again wakes everyone"
        await outbox.drop()  # invalidates the stream
        assert await _next(stream) is None, "reopened after the invalidate"
        await outbox.insert_one({"topic": "t", "partition": 0, "state": "pending"})
        assert await _next(stream) == TopicPartition("t", 0)
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()
        await client.close()
