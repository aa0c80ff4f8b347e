"""Tools for the inbox tests: produce events (and garbage) like a relay would, run inbox
workers as processes, and read effects, offsets and dead letters back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any, Self

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.structs import ConsumerRecord
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from outboxkit.core.mongodb import database_name
from outboxkit.embedded._process import die_with_parent
from outboxkit.schemas import Event, encode
from tests import timeouts
from tests.helpers import started_worker, wait_for
from tests.integration.inbox_app import EFFECTS_DDL
from tests.raw_batches import RawRecord, raw_batch

REPO = Path(__file__).resolve().parents[2]

INBOX_ENV = {
    **timeouts.INBOX_ENV,
    "OUTBOXKIT_HANDLER_ATTEMPTS": "3",
    "PYTHONPATH": str(REPO),
}


#: ``outboxkit inbox`` running the test app, as in production.
CLI = ("-m", "outboxkit", "inbox", "tests.integration.inbox_app:inbox")
#: The same worker with a store that SIGKILLs it after database commits (TEST_CRASH_AFTER_COMMIT).
CRASHING = ("-m", "tests.integration.inbox_app")


class InboxProcess:
    def __init__(self, log_dir: Path, env: dict[str, str], command: Sequence[str] = CLI) -> None:
        self.log_path = log_dir / f"inbox-{uuid.uuid4().hex[:6]}.log"
        self._env = {**os.environ, **INBOX_ENV, **env}
        self._command = command
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> InboxProcess:
        with self.log_path.open("ab") as log:
            self.process = started_worker(
                subprocess.Popen(
                    [sys.executable, *self._command],
                    env=self._env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 - no leftovers if pytest dies
                )
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def inbox_env(url: str, bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    """Environment of an inbox worker for ``topic``; its inbox (and group) is named after it."""
    return {
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOXKIT_TOPICS": topic,
        "TEST_INBOX_NAME": topic,
        **extra,
    }


def group_of(topic: str) -> str:
    return f"outboxkit.inbox.{topic}"


async def create_effects_table(url: str) -> None:
    if url.startswith("mongodb"):
        async with mongo_client(url) as client:
            db = client.get_database(database_name(url))
            await db.create_collection("effects")
        return
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(EFFECTS_DDL)


async def produce(
    bootstrap: str,
    events: Sequence[Event],
    *,
    raw: Sequence[tuple[str, bytes | None, list[tuple[str, bytes]]]] = (),
) -> None:
    """Publish encoded ``events`` (and ``raw`` (topic, value, headers) records) as a relay would."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for event in events:
            wire = encode(event, source="urn:test")
            await producer.send(wire.topic, wire.value, key=wire.key, headers=list(wire.headers))
        for topic, value, headers in raw:
            await producer.send(topic, value, key=b"raw", headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def mongo_client(url: str) -> AsyncIterator[AsyncMongoClient[dict[str, Any]]]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, uuidRepresentation="standard")
    try:
        yield client
    finally:
        await client.close()


Effect = tuple[uuid.UUID, str, int]


class InboxTables:
    """The test app's ``effects`` (event id, entity, seq) and the inbox's dedupe records, read
    through one MongoDB client or PostgreSQL connection for as long as the ``async with``
    lasts: a test that polls keeps one (tests/README.md)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._mongo: AsyncMongoClient[dict[str, Any]] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> Self:
        if self.url.startswith("mongodb"):
            self._mongo = AsyncMongoClient(self.url, uuidRepresentation="standard")
        else:
            self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._mongo is not None:
            await self._mongo.close()
        if self._conn is not None:
            await self._conn.close()

    def _db(self) -> AsyncDatabase[dict[str, Any]] | None:
        """The MongoDB database, or None on PostgreSQL (then :meth:`_sql` answers)."""
        return None if self._mongo is None else self._mongo.get_database(database_name(self.url))

    async def _sql(self, query: str) -> list[Any]:
        assert self._conn is not None, "use as: async with InboxTables(url) as tables"
        try:
            cur = await self._conn.execute(query)
        except psycopg.OperationalError:
            # The server restarted or failed over since the last read (a database fault of
            # the test's): once more on a new connection (with a multi-host URL, the primary).
            await self._conn.close()
            self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            cur = await self._conn.execute(query)
        return await cur.fetchall()

    async def effects(self) -> list[Effect]:
        if (db := self._db()) is not None:
            return [(d["event_id"], d["entity"], d["seq"]) async for d in db.effects.find()]
        return await self._sql("SELECT event_id, entity, seq FROM effects")

    async def effect_count(self) -> int:
        if (db := self._db()) is not None:
            return await db.effects.count_documents({})
        [(count,)] = await self._sql("SELECT count(*) FROM effects")
        return int(count)

    async def effect_times(self) -> dict[uuid.UUID, list[float]]:
        """Event id → when each of its effects was written (one, unless G6 broke)."""
        found: dict[uuid.UUID, list[float]] = {}
        if (db := self._db()) is not None:
            async for doc in db.effects.find({}, {"event_id": 1, "at": 1}):
                at = doc["at"].replace(tzinfo=UTC).timestamp()
                found.setdefault(doc["event_id"], []).append(at)
            return found
        for event_id, at in await self._sql(
            "SELECT event_id, extract(epoch FROM at)::float8 FROM effects"
        ):
            found.setdefault(event_id, []).append(at)
        return found

    async def dedupe_records(self) -> int:
        """The inbox's dedupe rows (documents), all consumers."""
        if (db := self._db()) is not None:
            return await db.get_collection("outboxkit.inbox").count_documents({})
        [(count,)] = await self._sql("SELECT count(*) FROM outboxkit.inbox")
        return int(count)


async def effects(url: str) -> list[Effect]:
    async with InboxTables(url) as tables:
        return await tables.effects()


async def wait_effects(
    url: str, until: Callable[[list[Effect]], bool], *, within: float, what: str
) -> None:
    """Wait until ``until`` holds for the effects taken so far, reading them through one
    :class:`InboxTables` for the whole wait."""
    async with InboxTables(url) as tables:

        async def holds() -> bool:
            return until(await tables.effects())

        await wait_for(holds, within=within, what=what)


class GroupProgress:
    """Whether a consumer group has committed offsets up to the end of every partition of a
    topic, read through one admin client and one consumer for as long as the ``async with``
    lasts. A new pair for each look cost 8 ms of the test's CPU, 26 ms of the broker's and
    116 ms; polled every 20 ms, test_inbox.py spent 88 of its 138 s in such looks, beside the
    workers under test."""

    def __init__(self, bootstrap: str) -> None:
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed"
        )

    async def __aenter__(self) -> Self:
        await self._admin.start()
        try:
            await self._consumer.start()
        except BaseException:
            await self._admin.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._consumer.stop()
        finally:
            await self._admin.close()

    async def caught_up(self, group: str, topic: str, partitions: int) -> bool:
        try:
            committed = await self._admin.list_consumer_group_offsets(group)
        except KafkaError:  # no group yet, or its coordinator is loading
            return False
        tps = [KafkaTP(topic, p) for p in range(partitions)]
        end = await self._consumer.end_offsets(tps)
        # A partition that never had a record has no committed offset, and needs none.
        return all((committed[tp].offset if tp in committed else 0) >= end[tp] for tp in tps)


async def wait_caught_up(
    bootstrap: str,
    group: str,
    topic: str,
    partitions: int,
    *,
    within: float,
    what: str,
    interval: float = 0.02,
) -> None:
    """Wait until ``group`` has committed offsets up to the end of every partition of
    ``topic``, looking through one :class:`GroupProgress` for the whole wait."""
    async with GroupProgress(bootstrap) as progress:
        await wait_for(
            lambda: progress.caught_up(group, topic, partitions),
            within=within,
            interval=interval,
            what=what,
        )


async def read_all(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = KafkaTP(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records: list[ConsumerRecord[bytes, bytes]] = []
        async with asyncio.timeout(30):
            while await consumer.position(tp) < end:
                records.extend((await consumer.getmany(tp, timeout_ms=500)).get(tp, []))
        return records
    finally:
        await consumer.stop()


async def produce_raw_batch(
    bootstrap: str, topic: str, records: Sequence[RawRecord], *, partition: int = 0
) -> None:
    """Write ``records`` (key, value, headers with **raw bytes** as names) as one record batch
    (:func:`tests.raw_batches.raw_batch`), with a plain Produce request."""
    batch = raw_batch(records)
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        client.add_topic(topic)
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(KafkaTP(topic, partition))
        request = ProduceRequest(None, -1, 30_000, [(topic, [(partition, batch)])])
        response = await client.send(leader, request)
        [(_, [(_, error_code, *_)])] = response.topics
        assert error_code == 0, f"produce failed with error code {error_code}"
    finally:
        await client.close()
