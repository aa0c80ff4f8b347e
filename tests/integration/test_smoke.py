"""End to end through the real servers: rows into PostgreSQL, encoded events through Kafka,
consumed and decoded to equal events, on the partition every component computes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from outboxkit.schemas import Event, EventRegistry, encode, partition_for_key
from tests.integration.conftest import MakeTopic

registry = EventRegistry()


@registry.register
class OrderPlaced(Event, type="orders.order_placed", version=1, key_field="customer_id"):
    order_id: int
    customer_id: str
    total: Decimal


async def test_rows_events_and_partitions_agree(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic("orders", partitions=3)
    events = [
        OrderPlaced(
            topic=topic,
            order_id=i,
            customer_id=f"customer-{i % 4}",
            total=Decimal(f"{i}.50"),
            occurred_at=datetime(2026, 1, 1, 12, 0, i, 123456, tzinfo=UTC),
            headers={"traceparent": f"00-{i:032x}-{i:016x}-01"},
        )
        for i in range(12)
    ]

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text, total numeric)")
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO orders VALUES (%s, %s, %s)",
                [(e.order_id, e.customer_id, e.total) for e in events],
            )
        await conn.commit()
        cur = await conn.execute("SELECT count(*), sum(total) FROM orders")
        assert await cur.fetchone() == (12, sum(e.total for e in events))

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for event in events:
            wire = encode(event, source="urn:outboxkit:tests")
            # No partition given: aiokafka's default partitioner must agree with ours.
            await producer.send_and_wait(
                wire.topic, wire.value, key=wire.key, headers=list(wire.headers)
            )
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    received: dict[str, tuple[Event, int]] = {}
    try:
        async with asyncio.timeout(30):
            while len(received) < len(events):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for record in records:
                        event = registry.decode_record(record)
                        received[str(event.id)] = (event, record.partition)
    finally:
        await consumer.stop()

    for event in events:
        decoded, partition = received[str(event.id)]
        assert decoded == event
        assert partition == partition_for_key(event.key, 3)
