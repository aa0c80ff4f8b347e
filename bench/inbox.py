"""Inbox throughput: handled events/s with a handler that inserts one row, against the ceiling
(raw aiokafka consumption of the same topic), with a small and a large dedupe table.

    python bench/inbox.py [--events 20000] [--partitions 6] [--workers 1,2]

Starts its own PostgreSQL (durable settings) and one Apache Kafka node. Prints figures, asserts
nothing; the machine is shared, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry

from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.inbox import Inbox, InboxMetrics, InboxSettings, InboxWorker, PostgresInboxStore
from outboxkit.migrations import migrate
from outboxkit.schemas import Event, encode


class Paid(Event, type="bench.paid", key_field="account"):
    account: str
    amount: int


async def _produce(bootstrap: str, topic: str, count: int, keys: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = []
        for i in range(count):
            wire = encode(Paid(topic=topic, account=f"a{i % keys}", amount=i), source="urn:bench")
            futures.append(
                await producer.send(topic, wire.value, key=wire.key, headers=list(wire.headers))
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _ceiling(bootstrap: str, topic: str, count: int) -> float:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=f"bench-ceiling-{uuid.uuid4().hex[:6]}",
        isolation_level="read_committed",
    )
    await consumer.start()
    seen, started = 0, time.perf_counter()
    try:
        while seen < count:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=2000)).values():
                seen += len(records)
    finally:
        await consumer.stop()
    return count / (time.perf_counter() - started)


async def _run_inbox(url: str, bootstrap: str, topic: str, count: int, workers: int) -> float:
    inbox = Inbox(f"bench-{uuid.uuid4().hex[:6]}")

    @inbox.handler(Paid)
    async def record(event: Paid, tx: psycopg.AsyncConnection[Any]) -> None:
        await tx.execute("INSERT INTO payments VALUES (%s, %s)", (event.id, event.amount))

    settings = InboxSettings(
        database_url=url, kafka_bootstrap_servers=bootstrap, topics=topic, cleanup_interval=3600
    )
    stores = [PostgresInboxStore(url) for _ in range(workers)]
    runs = [
        InboxWorker(inbox, settings, store, metrics=InboxMetrics(CollectorRegistry()))
        for store in stores
    ]
    for store in stores:
        await store.__aenter__()
    tasks = [asyncio.create_task(w.run()) for w in runs]
    started = time.perf_counter()
    try:
        while True:
            async with await psycopg.AsyncConnection.connect(url) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM outboxkit.inbox WHERE consumer = %s", (inbox.name,)
                )
                row = await cur.fetchone()
            if row and row[0] >= count:
                return count / (time.perf_counter() - started)
            if any(t.done() for t in tasks):
                [t.result() for t in tasks if t.done()]
            await asyncio.sleep(0.2)
    finally:
        for w in runs:
            w.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for store in stores:
            await store.__aexit__(None, None, None)


async def main(args: argparse.Namespace) -> None:
    with EmbeddedPostgres() as pg, KafkaCluster(1) as kafka:
        url, bootstrap = pg.url(), kafka.bootstrap_servers
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await migrate(conn)
            await conn.execute("CREATE TABLE payments (event_id uuid, amount int)")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic("paid", args.partitions, 1)])
        await admin.close()
        await _produce(bootstrap, "paid", args.events, keys=1000)
        ceiling = await _ceiling(bootstrap, "paid", args.events)
        print(f"ceiling: raw aiokafka consume (read_committed): {ceiling:,.0f} records/s")
        rows = [
            ("small dedupe table (10K rows of another consumer)", 10_000),
            ("large dedupe table (1M rows of another consumer)", 1_000_000),
        ]
        for label, prefill in rows:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute("TRUNCATE outboxkit.inbox")
                await conn.execute(
                    "INSERT INTO outboxkit.inbox (consumer, event_id, event_type, topic, partition,"
                    " \"offset\") SELECT 'other', gen_random_uuid(), 'x', 't', 0, g "
                    "FROM generate_series(1, %s) g",
                    (prefill,),
                )
                await conn.execute("VACUUM ANALYZE outboxkit.inbox")
            for workers in args.workers:
                rate = await _run_inbox(url, bootstrap, "paid", args.events, workers)
                print(
                    f"{label}, {workers} worker(s): {rate:,.0f} events/s handled "
                    f"({rate / ceiling:.2f}x ceiling)"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    asyncio.run(main(parser.parse_args()))
