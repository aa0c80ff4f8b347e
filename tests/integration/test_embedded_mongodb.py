"""The MongoDB server the MongoDB backends are tested against: a real single-node replica set
with transactions, change streams and TTL indexes, that survives SIGKILL and restarts quickly."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import OperationFailure

from outboxkit.embedded.mongodb import EmbeddedMongo, EmbeddedMongoReplicaSet, StopMode
from tests.helpers import wait_for

Doc = dict[str, Any]
MongoFactory = Callable[..., EmbeddedMongo]

#: Measured: 0.6 to 0.8 s from spawn to a writable primary on a fresh data directory, 0.5 to 1.1 s
#: after a SIGKILL (2 cores, idle). The bound leaves room for a loaded shared machine.
START_BOUND_S = 20.0

_NO_SUCH_TRANSACTION = 251
_WRITE_CONFLICT = 112


async def test_the_server_is_a_single_node_replica_set(mongo_url: str) -> None:
    async with AsyncMongoClient[Doc](mongo_url) as client:
        hello = await client.admin.command("hello")
        status = await client.admin.command("replSetGetStatus")
    assert hello["setName"] == status["set"]
    assert hello["isWritablePrimary"]
    assert [m["stateStr"] for m in status["members"]] == ["PRIMARY"]


async def test_a_committed_transaction_writes_everything_and_an_aborted_one_nothing(
    mongo_url: str,
) -> None:
    async with AsyncMongoClient[Doc](mongo_url) as client:
        db = client.get_default_database()
        async with client.start_session() as session:
            async with await session.start_transaction():
                await db.orders.insert_one({"_id": 1}, session=session)
                await db.outbox.insert_many([{"_id": "a"}, {"_id": "b"}], session=session)
                # Not visible outside the transaction before it commits.
                assert await db.outbox.count_documents({}) == 0
            assert await db.orders.count_documents({}) == 1
            assert await db.outbox.count_documents({}) == 2

            await session.start_transaction()
            await db.orders.insert_one({"_id": 2}, session=session)
            await db.outbox.insert_one({"_id": "c"}, session=session)
            await session.abort_transaction()
        assert await db.orders.distinct("_id") == [1]
        assert sorted(await db.outbox.distinct("_id")) == ["a", "b"]


async def test_a_change_stream_sees_an_insert_committed_after_it_opened(mongo_url: str) -> None:
    async with AsyncMongoClient[Doc](mongo_url) as client:
        outbox = client.get_default_database().outbox
        await outbox.insert_one({"_id": "before"})
        async with await outbox.watch([{"$match": {"operationType": "insert"}}]) as stream:
            async with client.start_session() as session, await session.start_transaction():
                await outbox.insert_one({"_id": "after"}, session=session)
            async with asyncio.timeout(10):
                change = await stream.next()
    assert change["documentKey"] == {"_id": "after"}


async def test_a_partial_ttl_index_removes_only_the_expired_documents_it_covers(
    mongo_factory: MongoFactory,
) -> None:
    server = await asyncio.to_thread(mongo_factory, ttl_monitor_sleep_seconds=1)
    async with AsyncMongoClient[Doc](server.url("ttl")) as client:
        outbox = client.get_default_database().outbox
        # What a retention index on published records looks like.
        await outbox.create_index(
            "published_at",
            expireAfterSeconds=0,
            partialFilterExpression={"state": "published"},
        )
        info = (await outbox.index_information())["published_at_1"]
        assert info["expireAfterSeconds"] == 0
        past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        await outbox.insert_many(
            [
                {"_id": "published", "state": "published", "published_at": past},
                {"_id": "pending", "state": "pending", "published_at": past},
            ]
        )

        async def swept() -> bool:
            return await outbox.count_documents({"_id": "published"}) == 0

        await wait_for(swept, within=30, what="the TTL monitor to delete the expired document")
        assert await outbox.distinct("_id") == ["pending"]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_committed_data_survives_a_restart_on_the_same_port_and_data(
    mongo_factory: MongoFactory, mode: StopMode
) -> None:
    server = await asyncio.to_thread(mongo_factory)
    port = server.port
    async with AsyncMongoClient[Doc](server.url("app")) as client:
        outbox = client.get_default_database().outbox
        async with client.start_session() as session, await session.start_transaction():
            await outbox.insert_many([{"_id": i} for i in range(100)], session=session)
        await asyncio.to_thread(server.restart, mode)
        assert server.port == port
        # The same client carries on: it finds the primary again by itself.
        assert await outbox.count_documents({}) == 100
        await outbox.insert_one({"_id": "after"})
        assert await outbox.count_documents({}) == 101


_ABANDONING_WRITER = """
import sys, threading
from pymongo import MongoClient
client = MongoClient(sys.argv[1])
session = client.start_session()
session.start_transaction()
client.get_default_database().outbox.update_one({"_id": 1}, {"$set": {"by": "zombie"}},
                                                session=session)
print("in transaction", flush=True)
threading.Event().wait()  # until killed, the transaction open
"""


async def test_a_killed_writers_transaction_is_aborted_after_the_lifetime_limit(
    mongo_factory: MongoFactory,
) -> None:
    """mongod's default (60 s, checked every 30 s) held the dead writer's transaction and its
    write locks for 89.7 s in this test; the option brings that down to a few seconds, so tests
    of killed writers stay short. Without the option this test fails."""
    server = await asyncio.to_thread(mongo_factory, transaction_lifetime_limit_seconds=2)
    async with AsyncMongoClient[Doc](server.url("app")) as client:
        outbox = client.get_default_database().outbox
        await outbox.insert_one({"_id": 1})
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _ABANDONING_WRITER, server.url("app"), stdout=PIPE
        )
        try:
            assert writer.stdout is not None
            async with asyncio.timeout(60):
                assert await writer.stdout.readline() == b"in transaction\n"
        finally:
            writer.kill()
            await writer.wait()
        conflicts = 0

        async def update(session: AsyncClientSession) -> None:
            nonlocal conflicts
            try:
                await outbox.update_one({"_id": 1}, {"$set": {"by": "next"}}, session=session)
            except OperationFailure as exc:
                conflicts += exc.code == _WRITE_CONFLICT
                raise

        started = time.monotonic()
        # Write-conflicts with the dead writer's open transaction until mongod aborts it;
        # with_transaction retries it (TransientTransactionError) as the driver docs prescribe.
        async with client.start_session() as session:
            await session.with_transaction(update)
        waited = time.monotonic() - started
        assert conflicts > 0
        assert await outbox.find_one({"_id": 1}) == {"_id": 1, "by": "next"}
    assert waited < 30, f"the abandoned transaction held its locks for {waited:.1f} s"


async def test_a_transaction_left_open_cannot_commit_after_the_limit(
    mongo_factory: MongoFactory,
) -> None:
    server = await asyncio.to_thread(mongo_factory, transaction_lifetime_limit_seconds=1)
    async with AsyncMongoClient[Doc](server.url("app")) as client:
        outbox = client.get_default_database().outbox
        async with client.start_session() as session:
            await session.start_transaction()
            await outbox.insert_one({"_id": 1}, session=session)

            async def aborted() -> bool:
                status = await client.admin.command("serverStatus")
                return bool(status["transactions"]["totalAborted"])

            await wait_for(aborted, within=30, what="mongod to abort the expired transaction")
            with pytest.raises(OperationFailure) as failure:
                await session.commit_transaction()
        assert failure.value.code == _NO_SUCH_TRANSACTION
        assert await outbox.count_documents({}) == 0


def test_start_and_restart_after_sigkill_are_quick(mongo_factory: MongoFactory) -> None:
    started = time.monotonic()
    server = mongo_factory()
    first = time.monotonic() - started
    server.kill()
    started = time.monotonic()
    server.start()
    again = time.monotonic() - started
    assert server.running
    assert first < START_BOUND_S, f"first start (initiating the set) took {first:.1f} s"
    assert again < START_BOUND_S, f"restart after SIGKILL took {again:.1f} s"


# --- the three-member replica set --------------------------------------------------------------

ReplicaSetFactory = Callable[..., EmbeddedMongoReplicaSet]


def _majority_client(replica_set: EmbeddedMongoReplicaSet) -> MongoClient[Doc]:
    return MongoClient(replica_set.url("app"), w="majority", serverSelectionTimeoutMS=30_000)


def test_a_replica_set_fails_over_to_the_member_its_priorities_choose(
    mongo_replica_set_factory: ReplicaSetFactory,
) -> None:
    """Three members, member 0 primary; a step-down hands over at once, and member 1 ends up
    primary (the next priority); SIGKILL of
    the primary elects another member within the election timeout; the killed member restarts
    on its port and data, rejoins with what was written without it, and takes the primary back
    (highest priority). Every write acknowledged by a majority survives all of it."""
    replica_set = mongo_replica_set_factory()
    first, second, third = replica_set.members
    assert replica_set.states() == {0: "PRIMARY", 1: "SECONDARY", 2: "SECONDARY"}
    with _majority_client(replica_set) as client:
        docs = client.get_default_database().docs
        docs.insert_one({"_id": "before"})

        old, new = replica_set.step_down(seconds=5, catch_up_seconds=2)
        assert old is first
        assert new in (second, third)  # whichever secondary the hand-over chose …
        replica_set.wait_for_primary(second, timeout=60)  # … then the priorities' choice
        docs.insert_one({"_id": "after step-down"})  # the client found the new primary

        replica_set.wait_for_primary(first, timeout=60)  # back once its freeze ends
        first.kill()
        started = time.monotonic()
        elected = replica_set.primary(timeout=60)
        election = time.monotonic() - started
        assert elected in (second, third)
        replica_set.wait_for_primary(second, timeout=60)  # the priorities' choice
        docs.insert_one({"_id": "without member 0"})

        port = first.port
        first.start()
        assert first.port == port
        replica_set.wait_for_primary(first, timeout=60)  # caught up, and took over
        with first.client() as direct:
            ids = direct.get_database("app").docs.distinct("_id")
        assert sorted(ids) == ["after step-down", "before", "without member 0"]
    # Measured: 2.2 to 3 s with a 2 s election timeout (2 cores, idle).
    assert election < START_BOUND_S, f"no primary {election:.1f} s after the kill"


def test_a_rolling_restart_restarts_every_member_and_keeps_the_data(
    mongo_replica_set_factory: ReplicaSetFactory,
) -> None:
    replica_set = mongo_replica_set_factory()
    pids = {m.index: m.pid for m in replica_set.members}
    with _majority_client(replica_set) as client:
        docs = client.get_default_database().docs
        docs.insert_many([{"_id": i} for i in range(10)])
        order = replica_set.rolling_restart()
        # The secondaries first, lowest priority first, then the primary after its step-down.
        assert [m.index for m in order] == [2, 1, 0]
        assert all(m.pid not in (None, pids[m.index]) for m in replica_set.members)
        docs.insert_one({"_id": "after"})
        assert docs.count_documents({}) == 11
    assert set(replica_set.states().values()) <= {"PRIMARY", "SECONDARY"}
