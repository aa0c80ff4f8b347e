"""The relay's read of a partition's head stays an index range scan, with millions of rows in
mind: here thousands of published and other-partition rows around it, and the plan must not
read them (DESIGN.md: "claim queries must stay index-only and cheap")."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import psycopg
from pymongo import AsyncMongoClient

from outboxkit.core.mongodb import database_name
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.relay import MongoOutboxStorage, TopicPartition
from outboxkit.relay.mongodb.heads import head_pipeline, heads_pipeline, older_pending_query
from outboxkit.relay.postgres.storage import _QUERIES

TOPIC = "plans"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
AROUND = 20_000  # published rows + pending rows of other partitions
HEAD = 50  # pending rows of partition 0
LIMIT = 10


def _stages(plan: Any, key: str) -> list[dict[str, Any]]:
    """Every node of a plan tree (PostgreSQL "Plans", MongoDB "inputStage(s)")."""
    found = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return [n for n in found if key in n]


async def test_postgresql_head_read_is_an_index_range_scan(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO outboxkit.outbox (topic, partition, key, value, event_id, event_type, "
            "state, published_at) SELECT %s, i %% 6, ('k' || (i %% 1000))::bytea, '{}', "
            "gen_random_uuid(), 't', CASE WHEN i %% 2 = 0 THEN 'published' ELSE 'pending' END, "
            "now() FROM generate_series(1, %s) i WHERE i %% 6 <> 0 OR i %% 2 = 0",
            (TOPIC, AROUND),
        )
        await conn.execute(
            "INSERT INTO outboxkit.outbox (topic, partition, key, value, event_id, event_type) "
            "SELECT %s, 0, ('h' || i)::bytea, '{}', gen_random_uuid(), 't' "
            "FROM generate_series(1, %s) i",
            (TOPIC, HEAD),
        )
        await conn.execute("ANALYZE outboxkit.outbox")
        query = _QUERIES["settle_and_claim"]
        params = {
            "published": [],
            "topics": [TOPIC],
            "partitions": [0],
            "limit": LIMIT,
            "scan": LIMIT * 4,
            "keep": False,
            "depth": 4,
            "max_bytes": 64 * 1024 * 1024,
        }
        cur = await conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params)
        row = await cur.fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    scans = _stages(plan, "Relation Name")
    # (the statement's DELETE of the last batch is a ModifyTable node over a pkey index scan)
    outbox_scans = [
        s for s in scans if s["Relation Name"] == "outbox" and s["Node Type"] != "ModifyTable"
    ]
    assert outbox_scans
    for scan in outbox_scans:
        assert scan["Node Type"] in {"Index Scan", "Index Only Scan"}, scan["Node Type"]
    head = [s for s in outbox_scans if s.get("Index Name") == "outbox_pending_idx"]
    assert head, [s.get("Index Name") for s in outbox_scans]
    assert head[0]["Actual Rows"] <= LIMIT * 4, "the head read stops at its window"


async def test_mongodb_head_read_is_an_index_range_scan_without_sort(mongo_url: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_url, uuidRepresentation="standard"
    )
    db = client.get_database(database_name(mongo_url))
    await migrate_mongodb(db)
    now = datetime.now(UTC)

    def doc(partition: int, key: bytes, position: int, state: str) -> dict[str, Any]:
        return {
            "topic": TOPIC,
            "partition": partition,
            "position": position,
            "key": key,
            "value": b"{}",
            "headers": [],
            "event_id": uuid4(),
            "event_type": "t",
            "created_at": now,
            "state": state,
            "attempts": 0,
        }

    around = [
        doc(i % 6 if i % 2 else 0, b"k%d" % (i % 1000), i, "pending" if i % 2 else "published")
        for i in range(AROUND)
    ]
    head = [doc(0, b"h%d" % i, AROUND + i, "pending") for i in range(HEAD)]
    outbox = db.get_collection("outboxkit.outbox")
    await outbox.insert_many(around + head)
    failed = doc(0, b"h0", 0, "failed")
    await outbox.insert_one(failed)
    try:
        async with MongoOutboxStorage(mongo_url) as storage:

            async def explain(pipeline: list[dict[str, Any]], hint: str) -> dict[str, Any]:
                command = {"aggregate": storage.outbox.name, "pipeline": pipeline, "cursor": {}}
                return await storage.database.command(
                    "explain", {**command, "hint": hint}, verbosity="executionStats"
                )

            # The claim's one command: held keys, then each partition's head.
            claim = heads_pipeline([TP0, TP1], {TP0: [b"h0"]}, LIMIT, 4)
            unions = [
                stage["$unionWith"]["pipeline"][0]["$cursor"]
                for stage in (await explain(claim, "outbox_failed_idx"))["stages"]
                if "$unionWith" in stage
            ]
            # The same head read alone, where mongod reports what it examined.
            explained = await explain(head_pipeline(TP0, [b"h0"], LIMIT, 4), "outbox_head_idx")
            records = await storage.settle_and_claim([TP0], LIMIT, depth=4)
            where, fields = older_pending_query(TP0, {b"h1": AROUND + 5, b"h3": AROUND + 9})
            checked = await storage.outbox.find(where, fields, hint="outbox_head_idx").explain()
    finally:
        await client.close()
    # Each partition's head, inside the claim's command as alone (a $unionWith sub-pipeline
    # takes no hint): the $match, $sort and $limit before the $group run as one covered index
    # read (the "$cursor"); then only the chosen documents are fetched.
    assert len(unions) == 2
    for union in unions:
        plan = union["queryPlanner"]["winningPlan"]
        assert [s["indexName"] for s in _stages(plan, "indexName")] == ["outbox_head_idx"]
        assert [s["stage"] for s in _stages(plan, "stage")] == [
            "LIMIT",
            "PROJECTION_COVERED",
            "IXSCAN",
        ], plan
    cursor = explained["stages"][0]["$cursor"]
    winning = cursor["queryPlanner"]["winningPlan"]
    assert [s["indexName"] for s in _stages(winning, "indexName")] == ["outbox_head_idx"]
    assert not [s for s in _stages(winning, "stage") if s["stage"] == "SORT"], winning
    stats = cursor["executionStats"]
    assert stats["totalDocsExamined"] == 0, stats["totalDocsExamined"]  # covered: index only
    # The order barrier's check read: a covered range scan of the same index, bounded by the
    # newest position asked about.
    check_plan = checked["queryPlanner"]["winningPlan"]
    assert [s["indexName"] for s in _stages(check_plan, "indexName")] == ["outbox_head_idx"]
    assert checked["executionStats"]["totalDocsExamined"] == 0, checked["executionStats"]
    assert stats["totalKeysExamined"] <= LIMIT * 4 + 2, stats["totalKeysExamined"]
    assert [r.key for r in records][:2] == [b"h1", b"h2"]
