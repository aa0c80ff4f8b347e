"""The probes' harness: one run's context and result rows, and small Kafka helpers (topics,
producers, consumers, reading a topic back until a sentinel record)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

OK = "ok"
FAIL = "FAIL"
INFO = "info"
CHILD_READY_TIMEOUT = 30.0


class ProbeFailed(Exception):
    """A probe observed something other than what the broker feature promises."""


@dataclass
class Row:
    probe: str
    status: str
    seconds: float
    detail: str


@dataclass
class Ctx:
    bootstrap: str
    label: str
    admin: AIOKafkaAdminClient
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    rows: list[Row] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    kafka_jars: str | None = None

    def add(self, probe: str, status: str, seconds: float, detail: str) -> None:
        row = Row(probe, status, seconds, detail)
        self.rows.append(row)
        print(f"  {status:4} {probe} ({seconds:.2f}s) {detail}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- helpers


def since(t0: float) -> float:
    return time.monotonic() - t0


def describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no error"
    module = type(exc).__module__
    name = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
    text = str(exc).strip()
    return f"{name}: {text}" if text else name


async def outcome(awaitable: Awaitable[Any], limit: float = 20.0) -> BaseException | None:
    """Await and return the exception it raised (None when it succeeded)."""
    try:
        await asyncio.wait_for(awaitable, limit)
    except Exception as exc:
        return exc
    return None


async def stop_quietly(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.stop(), 15)


@contextlib.asynccontextmanager
async def running(producer: AIOKafkaProducer) -> AsyncIterator[AIOKafkaProducer]:
    """Start a producer and always stop it, also when start() itself failed."""
    try:
        await producer.start()
        yield producer
    finally:
        await stop_quietly(producer)


async def wait_until(predicate: Callable[[], bool], limit: float, what: str) -> float:
    t0 = time.monotonic()
    while not predicate():
        if since(t0) > limit:
            raise ProbeFailed(f"timed out after {limit:.0f}s waiting for {what}")
        await asyncio.sleep(0.01)
    return since(t0)


async def create_topic(ctx: Ctx, probe: str, partitions: int = 1) -> str:
    name = f"okbench-{ctx.run_id}-{probe}-{uuid.uuid4().hex[:6]}"
    resp = await ctx.admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=10000)
    for topic_error in resp.topic_errors:
        if topic_error[1]:
            raise ProbeFailed(f"create_topics({name}) error code {topic_error[1]}: {topic_error}")
    ctx.topics.append(name)
    return name


def new_producer(ctx: Ctx, **kwargs: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=ctx.bootstrap, acks="all", request_timeout_ms=15000, **kwargs
    )


def new_consumer(bootstrap: str, **kwargs: Any) -> AIOKafkaConsumer:
    kwargs.setdefault("auto_offset_reset", "earliest")
    kwargs.setdefault("enable_auto_commit", False)
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15000, **kwargs)


@dataclass
class Read:
    records: list[ConsumerRecord[bytes, bytes]]
    seconds: float
    found: bool

    @property
    def values(self) -> list[bytes | None]:
        return [r.value for r in self.records]


async def read_until(
    ctx: Ctx,
    topic: str,
    sentinel: bytes,
    isolation: str = "read_uncommitted",
    *,
    limit: float = 15.0,
    partitions: int = 1,
) -> Read:
    """Read the topic from the beginning until a record with value `sentinel` shows up."""
    consumer = new_consumer(ctx.bootstrap, isolation_level=isolation)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: list[ConsumerRecord[bytes, bytes]] = []
    t0 = time.monotonic()
    try:
        await consumer.start()
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while since(t0) < limit:
            batch = await consumer.getmany(timeout_ms=200)
            for tp in sorted(batch):
                records.extend(batch[tp])
            if any(r.value == sentinel for r in records):
                return Read(records, since(t0), True)
    finally:
        await stop_quietly(consumer)
    return Read(records, since(t0), False)


def show(values: Iterable[bytes | None]) -> str:
    return "[" + ",".join("None" if v is None else v.decode(errors="replace") for v in values) + "]"
