"""Per-key order on MongoDB when a transaction commits while the relay reads (issue #32).

A read that yields (mongod yields every so often; here at every document, through
``internalQueryExecYieldIterations=1``) resumes on a newer snapshot unless it is a snapshot read.
A transaction that commits meanwhile is then seen in part: only its records past the scan's
position. Positions of different keys interleave (``$$NOW`` has millisecond precision, and a
transaction of n records takes the n positions below its clock reading), so that part can be a
key's *later* records alone, and a relay that trusted the read published them first: on main
4bac9f4 this test's head read returned a key's record from the middle of one transaction.

The interleaving is widened here so that the scan spends all its time inside it: twenty keys
whose positions run alongside the committing key's, set through their position documents. A
round counts when the transaction's commit returned while the read was still running (mongod's
``$currentOp`` says so); the test needs at least one such round.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pymongo import AsyncMongoClient

from outboxkit.core.mongodb import database_name
from outboxkit.relay import MongoOutboxStorage, TopicPartition
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.mongodb.heads import HeadReader
from outboxkit.relay.mongodb.writer import MongoOutbox
from outboxkit.schemas import Event
from tests.helpers import wait_for
from tests.integration.conftest import migrate_mongodb_database

TOPIC = "torn"
TP0 = TopicPartition(TOPIC, 0)
ALONGSIDE = 20  # keys whose records interleave with the committing key's
RECORDS = 500  # records per key, the committing transaction's too
ROUNDS = 6

#: A query yields at every document, so a scan runs long and reacquires its snapshot often.
YIELD_ALWAYS = {"internalQueryExecYieldIterations": "1", "internalQueryExecYieldPeriodMS": "1"}


class Step(Event, type="torn.step", topic=TOPIC, key_field="entity"):
    entity: str
    seq: int


@pytest.fixture
async def yielding_mongo(mongo_factory: Any) -> str:
    server = mongo_factory(parameters=YIELD_ALWAYS)
    url = server.url("torn")
    await migrate_mongodb_database(url)
    return url


async def _head_read_running(client: AsyncMongoClient[dict[str, Any]], namespace: str) -> bool:
    ops = await client.admin.aggregate(
        [{"$currentOp": {}}, {"$match": {"ns": namespace, "command.aggregate": {"$exists": True}}}]
    )
    return bool(await ops.to_list())


@pytest.mark.parametrize("guard", ["snapshot read", "order barrier alone"])
async def test_a_transaction_committing_during_the_head_read_is_never_published_in_part(
    yielding_mongo: str, guard: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either guard alone keeps the order: the snapshot read sees the transaction whole or not at
    all; with the head read made a plain yielding read again, the order barrier holds back what
    it saw in part (and counts it)."""
    if guard == "order barrier alone":
        # The head read of 4bac9f4: a majority read, no snapshot (a read that yields resumes on
        # a newer one).
        monkeypatch.setattr(HeadReader, "snapshot", False)
    registry = CollectorRegistry()
    RelayMetrics(registry)

    def holds() -> float:
        return registry.get_sample_value("outboxkit_relay_order_holds_total", {"topic": TOPIC}) or 0

    held_before = holds()
    url = yielding_mongo
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, uuidRepresentation="standard")
    db = client.get_database(database_name(url))
    keys = db.get_collection("outboxkit.keys")
    outbox = MongoOutbox(source="urn:test", database=db.name)
    base = int(time.time() * 1_000_000) + 10**12  # above any clock reading: positions follow it
    namespace = f"{db.name}.outboxkit.outbox"
    overlapped = 0
    try:
        async with MongoOutboxStorage(url) as storage:
            await storage.register_topics({TOPIC: 1})
            for j in range(ALONGSIDE):
                await keys.insert_one(
                    {"_id": {"topic": TOPIC, "key": f"b{j}".encode()}, "position": base}
                )
                async with client.start_session() as session:
                    events = [Step(entity=f"b{j}", seq=i) for i in range(RECORDS)]

                    async def write(s: Any, events: list[Step] = events) -> None:
                        await outbox.add_many(s, events)

                    await session.with_transaction(write)
            for r in range(ROUNDS):
                entity = f"a{r}"
                await keys.insert_one(
                    {"_id": {"topic": TOPIC, "key": entity.encode()}, "position": base}
                )
                async with client.start_session() as session:
                    await session.start_transaction()
                    # Added one by one and in one call: both shapes a service writes.
                    await outbox.add(session, Step(entity=entity, seq=0))
                    await outbox.add_many(
                        session, [Step(entity=entity, seq=i) for i in range(1, RECORDS)]
                    )
                    read = asyncio.create_task(
                        storage.settle_and_claim([TP0], (ALONGSIDE + 1) * RECORDS, depth=1)
                    )
                    await wait_for(
                        lambda: _head_read_running(client, namespace),
                        interval=0,
                        what="the head read to start",
                    )
                    await session.commit_transaction()
                    overlapped += await _head_read_running(client, namespace)
                heads = {
                    step.entity: step.seq
                    for step in (Step.model_validate_json(rec.value or b"") for rec in await read)
                }
                assert heads.get(entity, 0) == 0, (
                    f"round {r}: the head read returned {entity}'s record {heads[entity]} of "
                    f"{RECORDS}, committed in one transaction, without the ones before it"
                )
                await db.get_collection("outboxkit.outbox").delete_many({"key": entity.encode()})
    finally:
        await client.close()
    assert overlapped, "no commit landed while the head read ran: this test tested nothing"
    if guard == "order barrier alone":
        assert holds() > held_before, "nothing was held back"
    else:
        assert holds() == held_before, "a snapshot read needs no hold"
