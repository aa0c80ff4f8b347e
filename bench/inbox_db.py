"""The database behind bench/inbox.py's workers: PostgreSQL or MongoDB, started here.

Each gives the URL the workers get, the inbox they run (``bench.inbox_app``), a fresh migrated
database with the handler's table or collection, a dedupe table prefilled with another
consumer's records, and how many events a consumer has handled (its dedupe records).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Protocol

import psycopg

from outboxkit.core.mongodb import MAJORITY_WRITE, collection, make_client
from outboxkit.embedded import EmbeddedPostgres
from outboxkit.embedded.mongodb import EmbeddedMongo
from outboxkit.inbox import MongoInboxStore
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.postgres import migrate

DATABASES = ("postgresql", "mongodb")
#: Inserts per transaction in :meth:`InboxDatabase.insert_cost` (an inbox batch's size).
PER_TRANSACTION = 100
MONGO_DB = "outboxkit_bench"


class InboxDatabase(Protocol):
    #: OUTBOXKIT_DATABASE_URL of the workers.
    url: str
    #: The ``outboxkit inbox`` target (``bench.inbox_app:…``).
    target: str
    description: str

    async def prepare(self) -> None:
        """Migrated, with the handler's table or collection."""

    async def prefill(self, rows: int) -> None:
        """Only ``rows`` dedupe records, all of another consumer."""

    async def handled(self, consumer: str) -> int:
        """Events ``consumer`` has handled (its dedupe records)."""

    async def insert_cost(self, inserts: int) -> float:
        """The client's CPU microseconds per insert of the bench's handler (``bench.inbox_app``),
        written as the inbox runs it: ``inserts`` of them, in transactions of
        :data:`PER_TRANSACTION`, timed in this thread (its loop and the driver's tasks); the
        table or collection is emptied afterwards. The floor of the handler's own cost."""


class PostgresInboxDatabase:
    target = "bench.inbox_app:inbox"
    description = "PostgreSQL (embedded, durable settings)"

    def __init__(self, url: str) -> None:
        self.url = url

    async def prepare(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await migrate(conn)
            await conn.execute("CREATE TABLE payments (event_id uuid, amount int)")

    async def prefill(self, rows: int) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute("TRUNCATE outboxkit.inbox")
            await conn.execute(
                "INSERT INTO outboxkit.inbox (consumer, event_id, event_type, topic, partition,"
                " \"offset\") SELECT 'other', gen_random_uuid(), 'x', 't', 0, g "
                "FROM generate_series(1, %s) g",
                (rows,),
            )
            await conn.execute("VACUUM ANALYZE outboxkit.inbox")

    async def insert_cost(self, inserts: int) -> float:
        async with await psycopg.AsyncConnection.connect(self.url) as conn:

            async def transaction() -> None:
                # Pipelined, as the inbox runs its handlers' statements.
                async with conn.transaction(), conn.pipeline():
                    for i in range(PER_TRANSACTION):
                        await conn.execute(
                            "INSERT INTO payments VALUES (%s, %s)", (uuid.uuid4(), i)
                        )

            await transaction()  # warm: the statement prepared, the connection's buffers
            started = time.thread_time()
            for _ in range(inserts // PER_TRANSACTION):
                await transaction()
            cpu = time.thread_time() - started
            await conn.execute("TRUNCATE payments")
            await conn.commit()
        return cpu / inserts * 1e6

    async def handled(self, consumer: str) -> int:
        async with await psycopg.AsyncConnection.connect(self.url) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM outboxkit.inbox WHERE consumer = %s", (consumer,)
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0


class MongoInboxDatabase:
    target = "bench.inbox_app:mongo_inbox"
    description = (
        "MongoDB (embedded mongod 6.0.5, single-node replica set, 0.25 GB WiredTiger cache; "
        "the inbox commits with majority write concern, journaled)"
    )

    def __init__(self, url: str) -> None:
        self.url = url

    async def prepare(self) -> None:
        client = make_client(self.url, connect_timeout=10, app_name="bench")
        try:
            await client.drop_database(MONGO_DB)
            db = client.get_database(MONGO_DB)
            await migrate_mongodb(db)
            await db.create_collection("payments")
        finally:
            await client.close()

    async def prefill(self, rows: int) -> None:
        client = make_client(self.url, connect_timeout=10, app_name="bench")
        try:
            records = collection(client.get_database(MONGO_DB), "inbox")
            await records.delete_many({})
            now = datetime.now(UTC)
            chunk = 10_000
            for start in range(0, rows, chunk):
                await records.insert_many(
                    [
                        {
                            "_id": {"consumer": "other", "event_id": uuid.uuid4()},
                            "event_type": "x",
                            "topic": "t",
                            "partition": 0,
                            "offset": start + i,
                            "received_at": now,
                            "expires_at": now + timedelta(days=7),
                        }
                        for i in range(min(chunk, rows - start))
                    ],
                    ordered=False,
                )
        finally:
            await client.close()

    async def insert_cost(self, inserts: int) -> float:
        client = make_client(self.url, connect_timeout=10, app_name="bench")
        try:
            payments = client.get_database(MONGO_DB).get_collection("payments")

            async def transaction() -> None:
                async with client.start_session() as session:
                    await session.start_transaction(write_concern=MAJORITY_WRITE)
                    for i in range(PER_TRANSACTION):
                        await payments.insert_one(
                            {"event_id": uuid.uuid4(), "amount": i}, session=session
                        )
                    await session.commit_transaction()

            await transaction()  # warm: the pool's connection, the server's description
            started = time.thread_time()
            for _ in range(inserts // PER_TRANSACTION):
                await transaction()
            cpu = time.thread_time() - started
            await payments.delete_many({})
        finally:
            await client.close()
        return cpu / inserts * 1e6

    async def handled(self, consumer: str) -> int:
        async with MongoInboxStore(self.url, app_name="bench") as store:
            return await store.count(consumer)


def start_database(kind: str, stack: contextlib.ExitStack) -> InboxDatabase:
    """The database of ``kind``, started now and stopped with ``stack``."""
    if kind == "mongodb":
        mongo = stack.enter_context(EmbeddedMongo(fetch=True))
        return MongoInboxDatabase(mongo.url(MONGO_DB))
    pg = stack.enter_context(EmbeddedPostgres())
    return PostgresInboxDatabase(pg.url())
