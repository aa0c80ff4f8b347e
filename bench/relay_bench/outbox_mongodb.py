"""The relay benchmark's outbox on MongoDB: :class:`MongoBenchOutbox`.

The same protocol as :class:`~bench.relay_bench.outbox.PostgresBenchOutbox`, with the product's
MongoDB writer (``MongoOutbox``, one multi-document transaction per event, retried as
:func:`outboxkit.core.mongodb.in_transaction` retries) and migrations. Two differences follow from
the backend, not from the bench:

- A relay on MongoDB declares nothing when it waits (the change stream wakes it on every
  insert; ``MongoWakeups.set_waiting`` is a no-op), so "the relays are idle" is read as "nothing
  of the topic is pending": the phases then wait ``--idle-gap`` as they do on PostgreSQL.
- The backlog is kept aside in ``bench.seed`` (a plain collection) and copied back into the
  outbox in one multi-document transaction, so that one commit makes it visible at once, as the
  PostgreSQL bench's ``INSERT … SELECT`` does. The copies keep their positions, which the
  writers' transactions took: a key's positions rise in the commit order of those transactions
  (docs/mongodb.md), and the relays publish a key in position order. So each kept event's
  ``seq`` is its rank among its key's events by position (``harness.with_seq``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession

from bench.relay_bench.harness import DRAIN_TOPIC, SOURCE, with_seq
from bench.relay_bench.order import KeySequences
from bench.relay_bench.outbox import BENCH_DB, SEED_WRITERS, WriteMany, Writer, fill, seeded
from outboxkit.core.mongodb import (
    MAJORITY_WRITE,
    Client,
    Collection,
    Database,
    Document,
    collection,
    in_transaction,
)
from outboxkit.migrations.mongodb import migrate
from outboxkit.relay import MongoOutbox, StorageUnavailableError
from outboxkit.schemas import Event

SEED = "bench.seed"
#: Documents per insert when the backlog is copied back (all in one transaction).
_COPY_CHUNK = 5000
#: Documents per backlog transaction (see load_backlog).
_LOAD_TRANSACTION = 30_000


def database_url(server_url: str, dbname: str = BENCH_DB) -> str:
    """``mongodb://host:port/?replicaSet=rs0`` → the same with ``/<dbname>`` as its path."""
    return urlsplit(server_url)._replace(path=f"/{dbname}").geturl()


def _client(url: str) -> Client:
    return AsyncMongoClient(url, uuidRepresentation="standard", tz_aware=True, appname="bench")


class _SharedClient:
    """One client (a service's connection pool) for a group of writers; closed with the last."""

    def __init__(self, url: str, users: int) -> None:
        self.client = _client(url)
        self.users = users

    async def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            await self.client.close()


class _MongoWriter:
    """A service's writer: one transaction per event (``in_transaction``: retried on a write
    conflict, committed with majority write concern)."""

    def __init__(self, shared: _SharedClient, outbox: MongoOutbox) -> None:
        self._shared = shared
        self._outbox = outbox

    async def write(self, event: Event) -> None:
        async def work(session: AsyncClientSession) -> None:
            await self._outbox.add(session, event)

        await in_transaction(self._shared.client, work, unavailable=StorageUnavailableError)

    async def close(self) -> None:
        await self._shared.release()


class MongoBenchOutbox:
    def __init__(self, server_url: str, dbname: str = BENCH_DB) -> None:
        self.url = database_url(server_url, dbname)
        self.dbname = dbname
        self._seeded = 0
        self._opened: Client | None = None

    # The client is made on first use, inside the event loop that uses it.
    @property
    def _client(self) -> Client:
        if self._opened is None:
            self._opened = _client(self.url)
        return self._opened

    @property
    def _db(self) -> Database:
        return self._client.get_database(self.dbname)

    @property
    def _outbox(self) -> Collection:
        return collection(self._db, "outbox")

    @property
    def _seed(self) -> Collection:
        return self._db.get_collection(SEED)

    async def prepare(self) -> None:
        await self._client.drop_database(self.dbname)
        await migrate(self._db)

    async def register_topic(self, topic: str, partitions: int) -> None:
        await collection(self._db, "topics").update_one(
            {"_id": topic}, {"$set": {"partitions": partitions}}, upsert=True
        )

    async def seed(self, rows: int, keys: int, topic: str = DRAIN_TOPIC) -> float:
        if self._seeded >= rows:
            return 0.0
        outbox = MongoOutbox(source=SOURCE, database=self.dbname)
        await self._outbox.delete_many({})
        clients = [_client(self.url) for _ in range(SEED_WRITERS)]

        def writer(client: Client) -> WriteMany:
            async def write(events: list[Event]) -> None:
                work = functools.partial(outbox.add_many, events=events)
                await in_transaction(client, work, unavailable=StorageUnavailableError)

            return write

        try:
            elapsed = await fill(rows, keys, topic, [writer(c) for c in clients])
        finally:
            for c in clients:
                await c.close()
        await self._seed.drop()
        sequences = KeySequences()
        chunk: list[Document] = []
        async for doc in self._outbox.find({}).sort([("position", 1), ("_id", 1)]):
            key = f"{doc['topic']}/{bytes(doc['key']).hex()}"
            doc["value"] = with_seq(bytes(doc["value"]), sequences.take(key))
            chunk.append(doc)
            if len(chunk) == _COPY_CHUNK:
                await self._seed.insert_many(chunk)
                chunk = []
        if chunk:
            await self._seed.insert_many(chunk)
        await self._outbox.delete_many({})
        distinct = len(await self._seed.distinct("key"))
        self._seeded = rows
        return seeded(rows, elapsed, distinct, "documents written by MongoOutbox.add_many")

    async def load_backlog(self, rows: int) -> float:
        """In transactions of at most _LOAD_TRANSACTION documents, in position order: one
        transaction of 100,000 fails on mongod's cache here (WiredTiger answers WriteConflict
        however often it is retried). Timed from the first commit, so the drain's figure never
        gains from the later commits (relays drain the first part while the rest arrives)."""
        documents: list[Document] = (
            await self._seed.find({}).sort([("position", 1), ("_id", 1)]).limit(rows).to_list()
        )
        first_commit: float | None = None
        for start in range(0, len(documents), _LOAD_TRANSACTION):
            part = documents[start : start + _LOAD_TRANSACTION]

            async def copy(session: AsyncClientSession, part: list[Document] = part) -> None:
                outbox = collection(self._db, "outbox", write_concern=MAJORITY_WRITE)
                for i in range(0, len(part), _COPY_CHUNK):
                    await outbox.insert_many(part[i : i + _COPY_CHUNK], session=session)

            await in_transaction(self._client, copy, unavailable=StorageUnavailableError)
            first_commit = first_commit or time.perf_counter()
        return first_commit or time.perf_counter()

    async def clear(self) -> None:
        await self._outbox.delete_many({})

    async def pending(self) -> int:
        return await self._outbox.count_documents({"state": "pending"})

    async def pending_by_partition(self, topic: str) -> dict[int, int]:
        cursor = await self._outbox.aggregate(
            [
                {"$match": {"topic": topic, "state": "pending"}},
                {"$group": {"_id": "$partition", "n": {"$sum": 1}}},
            ],
            hint="outbox_head_idx",
        )
        return {int(doc["_id"]): int(doc["n"]) for doc in await cursor.to_list()}

    async def states(self, event_ids: Sequence[str]) -> dict[str, str]:
        found = self._outbox.find(
            {"event_id": {"$in": [UUID(e) for e in event_ids]}},
            {"event_id": True, "state": True, "partition": True, "attempts": True},
        )
        return {
            str(d["event_id"]): f"{d['state']} p{d['partition']} attempts {d['attempts']}"
            for d in await found.to_list()
        }

    async def relays_idle(self, topic: str, partitions: int) -> bool:
        """Nothing of ``topic`` pending (a MongoDB relay declares nothing when it waits)."""
        found = await self._outbox.find_one(
            {"topic": topic, "state": "pending"}, {"_id": True}, hint="outbox_head_idx"
        )
        return found is None

    async def writers(self, count: int) -> list[Writer]:
        shared = _SharedClient(self.url, count)
        outbox = MongoOutbox(source=SOURCE, database=self.dbname)
        return [_MongoWriter(shared, outbox) for _ in range(count)]

    async def diagnostics(self, topic: str) -> str:
        lines = []
        ops = await self._client.admin.command({"currentOp": 1, "active": True})
        for op in ops.get("inprog", []):
            if op.get("ns", "").startswith(self.dbname + "."):
                lines.append(
                    f"mongod op: {op.get('appName')} {op.get('op')} {op.get('ns')} "
                    f"{op.get('secs_running')} s {str(op.get('command'))[:200]}"
                )
        stats: dict[str, Any] = await self._db.command({"collStats": "outboxkit.outbox"})
        lines.append(
            f"outbox: {stats.get('count')} documents, {stats.get('size')} bytes, indexes "
            f"{stats.get('indexSizes')}"
        )
        return "\n".join(lines)

    async def close(self) -> None:
        if self._opened is not None:
            await self._opened.close()
            self._opened = None
