"""Kafka I/O the benchmarks share: publish a backlog of events, the raw consume rate of a
topic (the ceiling a consumer is compared with), and Kafka's one-record transaction (the figure
every latency is printed beside)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from outboxkit.schemas import Event, encode


async def produce_events(bootstrap: str, events: Iterable[Event], *, linger_ms: int = 5) -> None:
    """Publish ``events`` as a relay would (CloudEvents binary mode, ``acks=all``)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=linger_ms)
    await producer.start()
    try:
        futures = []
        for event in events:
            wire = encode(event, source="urn:bench")
            futures.append(
                await producer.send(
                    wire.topic, wire.value, key=wire.key, headers=list(wire.headers)
                )
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def consume_rate(bootstrap: str, topic: str, count: int) -> float:
    """Records/s of a plain aiokafka consumer reading ``count`` records of ``topic``
    (``read_committed``, as the inbox and the pipeline read)."""
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
            for records in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                seen += len(records)
    finally:
        await consumer.stop()
    return count / (time.perf_counter() - started)


async def one_record_transactions(
    bootstrap: str, topic: str, transactions: int, *, transactional_id: str, pause: float = 0.0
) -> list[float]:
    """Wall time of each of ``transactions`` one-record transactions of one transactional
    producer to partition 0 of ``topic`` (which must exist), after 10 that warm up; ``pause``
    seconds between them."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, acks="all"
    )
    await producer.start()
    times = []
    try:
        for i in range(transactions + 10):
            started = time.perf_counter()
            await producer.begin_transaction()
            await producer.send(topic, b"x", key=b"k", partition=0)
            await producer.commit_transaction()
            if i >= 10:
                times.append(time.perf_counter() - started)
            if pause:
                await asyncio.sleep(pause)
    finally:
        await producer.stop()
    return times
