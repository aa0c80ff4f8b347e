"""The MongoDB claim's read (relay/mongodb/heads.py, ``HeadReader``) through its own interface,
on a real mongod: which records head each partition, the byte bound, and the order barrier's
check. Documents are inserted with chosen positions, so every expectation is exact.

Partition 0 holds, by position: a@10, b@11, a@12, c@13, a@14, b@15, d@16, and d@5 failed (d is
held back); partition 1 holds e@1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pymongo import AsyncMongoClient, monitoring

from outboxkit.core.mongodb import MAJORITY_READ, MongoConnection, collection, database_name
from outboxkit.relay.limits import record_bytes
from outboxkit.relay.mongodb.barrier import Link
from outboxkit.relay.mongodb.heads import HeadReader
from outboxkit.relay.records import OutboxRecord, TopicPartition

TOPIC = "heads"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
#: (partition, key, position, previous, state)
DOCS = [
    (0, b"d", 5, None, "failed"),
    (0, b"a", 10, None, "pending"),
    (0, b"b", 11, None, "pending"),
    (0, b"a", 12, 10, "pending"),
    (0, b"c", 13, None, "pending"),
    (0, b"a", 14, 12, "pending"),
    (0, b"b", 15, 11, "pending"),
    (0, b"d", 16, 5, "pending"),
    (1, b"e", 1, None, "pending"),
]


@pytest.fixture
async def reader(migrated_mongodb_url: str) -> AsyncIterator[HeadReader]:
    async with MongoConnection(
        migrated_mongodb_url, connect_timeout=10.0, app_name="outboxkit-test"
    ) as conn:
        outbox = collection(conn.database, "outbox", read_concern=MAJORITY_READ)
        now = datetime.now(UTC)
        await outbox.insert_many(
            {
                "topic": TOPIC,
                "partition": partition,
                "key": key,
                "position": position,
                "previous": previous,
                "state": state,
                # a value and headers of different sizes, so the byte bound counts each part
                "value": b"v" * (100 + position),
                "headers": [["h\u00e9", b"x" * position]],
                "event_id": uuid4(),
                "event_type": "t",
                "created_at": now,
                "attempts": 0,
            }
            for partition, key, position, previous, state in DOCS
        )
        yield HeadReader(conn.client, outbox)


def chains(read: list[tuple[OutboxRecord, Link]]) -> list[tuple[int, str, int, int | None]]:
    return [(r.partition, r.key.decode(), link.position, link.previous) for r, link in read]


async def test_each_partitions_head_is_its_oldest_keys_each_with_a_prefix_of_its_records(
    reader: HeadReader,
) -> None:
    """Key by key, oldest key first, each key's oldest ``depth`` in order, at most ``limit``
    keys per partition, the held key left out; each record with its link. Would catch a head
    that skipped a key's record, let a held key through, or mixed the partitions' limits."""
    read = await reader.read([TP0, TP1], 2, depth=2, max_bytes=None)
    assert chains(read) == [
        (0, "a", 10, None),
        (0, "a", 12, 10),
        (0, "b", 11, None),
        (0, "b", 15, 11),
        (1, "e", 1, None),
    ]
    wider = await reader.read([TP0], 10, depth=1, max_bytes=None)
    assert [(r.key, link.position) for r, link in wider] == [(b"a", 10), (b"b", 11), (b"c", 13)]
    assert await reader.read([], 10, depth=1, max_bytes=None) == []


async def test_held_keys_beyond_the_query_budget_are_left_out_after_the_read(
    reader: HeadReader,
) -> None:
    """With no room for held keys in the query (``$nin``), the held key is still left out:
    would catch parked keys dropped from the query and then published."""
    reader.held_in_query = 0
    read = await reader.read([TP0], 10, depth=3, max_bytes=None)
    assert b"d" not in {r.key for r, _ in read}
    assert [link.position for _, link in read] == [10, 12, 14, 11, 15, 13]


async def test_the_byte_bound_counts_exactly_what_record_bytes_counts(reader: HeadReader) -> None:
    """Of a partition, records while the bytes before them stay under the bound: the first
    always, the other partition unaffected. The bounds sit exactly at a record's edge, so a size
    mongod counts differently from ``record_bytes`` (a header's name in UTF-8, a value) by one
    byte would change the result."""
    whole = await reader.read([TP0, TP1], 2, depth=2, max_bytes=None)
    sizes = [record_bytes(r) for r, _ in whole]
    two = sizes[0] + sizes[1]
    exact = await reader.read([TP0, TP1], 2, depth=2, max_bytes=two)
    assert chains(exact) == chains(whole)[:2] + chains(whole)[4:]
    one_more = await reader.read([TP0, TP1], 2, depth=2, max_bytes=two + 1)
    assert chains(one_more) == chains(whole)[:3] + chains(whole)[4:]
    first_only = await reader.read([TP0, TP1], 2, depth=2, max_bytes=1)
    assert chains(first_only) == [chains(whole)[0], chains(whole)[4]]
    assert [r.value for r, _ in first_only] == [whole[0][0].value, whole[4][0].value]
    assert await reader.read([TP0, TP1], 2, depth=2, max_bytes=sum(sizes)) == whole


async def test_older_pending_names_the_keys_with_an_older_record_still_pending(
    reader: HeadReader,
) -> None:
    """The order barrier's check: a key asked about at a position above a pending record of its
    own is named, one asked at its oldest pending record is not, and a failed record does not
    count (it holds back its key elsewhere). Would catch a check that let a torn read through."""
    asked: dict[TopicPartition, dict[bytes, int]] = {
        TP0: {b"a": 12, b"b": 11, b"c": 13, b"d": 16},
        TP1: {b"e": 1},
    }
    assert await reader.older_pending(asked) == {(TOPIC, b"a")}
    assert await reader.older_pending({TP0: {b"a": 10, b"b": 15}}) == {(TOPIC, b"b")}
    assert await reader.older_pending({}) == set()


async def test_a_key_held_or_released_since_the_last_read_counts_at_once(
    reader: HeadReader,
) -> None:
    """The head read leaves out, in its query, the keys the last read found held, and reads the
    held keys again in the same command: a key parked since is left out of this very read, and
    a key released since (its failed record skipped) is in it. Would catch a read that trusted
    its memory of the held keys for a cycle (a parked key overtaken, or a released key left
    waiting for the next sweep)."""
    outbox = reader.outbox
    keys = [
        (r.key, link.position) for r, link in await reader.read([TP0], 10, depth=1, max_bytes=None)
    ]
    assert keys == [(b"a", 10), (b"b", 11), (b"c", 13)]
    await outbox.update_one({"key": b"a", "position": 10}, {"$set": {"state": "failed"}})
    await outbox.delete_one({"key": b"d", "position": 5})  # `outboxkit outbox skip`
    keys = [
        (r.key, link.position) for r, link in await reader.read([TP0], 10, depth=1, max_bytes=None)
    ]
    assert keys == [(b"b", 11), (b"c", 13), (b"d", 16)]


async def test_one_aggregate_chooses_every_partitions_head(migrated_mongodb_url: str) -> None:
    """The claim's read is two commands whatever the number of partitions: one aggregate
    chooses every head and reads the held keys, one find reads the records (it was one read per
    partition, one for the held keys and the find); the aggregate stays one while the held keys
    do not change."""
    commands: list[str] = []

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            commands.append(event.command_name)

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            pass

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        migrated_mongodb_url, uuidRepresentation="standard", event_listeners=[Listener()]
    )
    try:
        database = client.get_database(database_name(migrated_mongodb_url))
        outbox = collection(database, "outbox", read_concern=MAJORITY_READ)
        await outbox.insert_one({"topic": TOPIC, "partition": 3, "key": b"x", "state": "failed"})
        reader = HeadReader(client, outbox)
        tps = [TopicPartition(TOPIC, p) for p in range(6)]
        await outbox.insert_many(
            {"topic": TOPIC, "partition": p, "key": b"k", "position": 1, "state": "pending"}
            | {"value": b"v", "headers": [], "event_id": uuid4(), "created_at": datetime.now(UTC)}
            | {"attempts": 0, "previous": None}
            for p in range(6)
        )
        commands.clear()
        for _ in range(3):
            read = await reader.read(tps, 10, depth=1, max_bytes=1_000_000)
            assert [(r.partition, r.key) for r, _ in read] == [(p, b"k") for p in range(6)]
        # the first read learns of the held key and reads its partition again
        assert commands == ["aggregate", "aggregate", "find"] + ["aggregate", "find"] * 2, commands
    finally:
        await client.close()
