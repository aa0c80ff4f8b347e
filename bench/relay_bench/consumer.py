"""Commit → consumer timing: paced writers that note each event's commit time, and a
``read_committed`` consumer in a child process that notes each record's arrival; and reading a
topic back (``read_committed``) for the per-key order check."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from bench.relay_bench.harness import (
    LATENCY_TOPIC,
    Ctx,
    customer_id,
    ensure_topic,
    make_event,
    pct,
)
from bench.relay_bench.order import KeySequences, Published
from bench.relay_bench.outbox import Writer
from bench.relay_bench.relays import ENTRY, Relays, running_relays


async def consumer_child(bootstrap: str, topic: str, partitions: int, out: Path) -> None:
    """Runs in a child process: a read_committed consumer that stamps each record's arrival."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    #: Per record: event id, arrival, Kafka timestamp, partition, offset, key, seq.
    seen: list[tuple[str, float, int, int, int, str, int]] = []
    #: Events received at least once: what the parent waits for (a re-publish is no progress).
    distinct: set[str] = set()
    try:
        tps = [KafkaTP(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        print("ready", flush=True)
        last_report = 0
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for tp, records in batches.items():
                for record in records:
                    ce_id = next((v for k, v in record.headers if k == "ce_id"), b"").decode()
                    key, seq = key_and_seq(record.key, record.value)
                    seen.append(
                        (ce_id, now, record.timestamp, tp.partition, record.offset, key, seq)
                    )
                    distinct.add(ce_id)
            if len(distinct) != last_report:
                last_report = len(distinct)
                print(f"count {last_report}", flush=True)
    finally:
        await consumer.stop()
        await asyncio.to_thread(out.write_text, json.dumps(seen))


def key_and_seq(key: bytes | None, value: bytes | None) -> tuple[str, int]:
    """A bench event's key and ``seq`` from its record (-1: not a bench event)."""
    try:
        seq = int(json.loads(value or b"{}").get("seq", -1))
    except (ValueError, TypeError, AttributeError):
        seq = -1
    return (key or b"").decode(errors="replace"), seq


@dataclass
class Arrival:
    ce_id: str
    at: float
    #: The record's Kafka timestamp (set by the relay's send), epoch seconds, ms resolution.
    sent: float
    partition: int


@dataclass
class Commits:
    """Event id → commit time (when COMMIT returned) and label (warmup, steady, idle, …)."""

    at: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    behind: list[float] = field(default_factory=list)
    #: Each key's next ``seq`` (see :func:`paced_writes`).
    sequences: KeySequences = field(default_factory=KeySequences)
    #: Events whose commit was cut off (the database went away): committed or not, nobody
    #: knows, so they are neither expected nor timed.
    in_doubt: set[str] = field(default_factory=set)


class InDoubtError(Exception):
    """A writer lost its database during ``write``: the event may or may not be committed."""


class LatencyConsumer:
    """The consumer child process: started before the writes, stopped after them."""

    def __init__(self, ctx: Ctx, topic: str, name: str = "latency") -> None:
        self.ctx = ctx
        self.topic = topic
        self.out = ctx.workdir / f"{name}-consumer.json"
        self.received = 0
        self._changed = asyncio.Condition()
        self._child: asyncio.subprocess.Process | None = None
        self._follower: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LatencyConsumer:
        self._child = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ENTRY),
            "--child-consumer",
            self.ctx.bootstrap,
            self.topic,
            str(self.ctx.args.partitions),
            str(self.out),
            stdout=asyncio.subprocess.PIPE,
        )
        assert self._child.stdout is not None
        line = await asyncio.wait_for(self._child.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"latency consumer: {line!r}")
        self._follower = asyncio.create_task(self._follow(self._child.stdout))
        return self

    async def _follow(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            text = raw.decode().strip()
            if text.startswith("count "):
                async with self._changed:
                    self.received = int(text.split()[1])
                    self._changed.notify_all()

    async def wait_for(self, count: int, within: float) -> None:
        async with self._changed, asyncio.timeout(within):
            await self._changed.wait_for(lambda: self.received >= count)

    async def __aexit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.send_signal(signal.SIGTERM)
            await self._child.wait()
        if self._follower is not None:
            self._follower.cancel()

    async def arrivals(self) -> list[Arrival]:
        """First arrival of each event."""
        text = await asyncio.to_thread(self.out.read_text)
        seen: dict[str, Arrival] = {}
        for ce_id, at, ts, partition, *_ in json.loads(text):
            if ce_id not in seen:
                seen[ce_id] = Arrival(str(ce_id), float(at), int(ts) / 1000, int(partition))
        return list(seen.values())

    async def published(self, events: Container[str]) -> list[Published]:
        """Every record received (re-deliveries too) of ``events``, for the order check: the
        consumer starts at the end of the topic, but a record of an earlier phase committed
        after that point must not count."""
        text = await asyncio.to_thread(self.out.read_text)
        return [
            Published(int(partition), int(offset), str(key), int(seq))
            for ce_id, _, _, partition, offset, key, seq in json.loads(text)
            if ce_id in events and int(seq) >= 0
        ]


async def paced_writes(
    writers: Sequence[Writer],
    commits: Commits,
    label: str,
    rate: float,
    seconds: float,
    *,
    rng: random.Random,
    keys: int,
    topic: str,
) -> float:
    """Commit one event per transaction at ``rate``/s in all, each writer on its own schedule
    (a late writer does not burst to catch up); return the rate achieved. The commit time is
    taken when COMMIT returns.

    Writer ``i`` of ``n`` alone writes the keys ``k ≡ i (mod n)`` (a random one each time), and
    starts a transaction only once its previous one has committed: so a key's ``seq``, taken
    from ``commits.sequences`` as its writer makes the event, is the key's commit order."""
    if keys < len(writers):
        raise ValueError(f"{keys} keys for {len(writers)} writers: each writer owns some keys")
    period = len(writers) / rate
    per_writer = max(1, round(rate * seconds / len(writers)))
    start = time.perf_counter() + 0.02
    written = 0

    async def write(writer: Writer, owned: range, offset: float) -> None:
        nonlocal written
        due = start + offset
        for _ in range(per_writer):
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                commits.behind.append(-delay)
                due = time.perf_counter()
            due += period
            key = owned[rng.randrange(len(owned))]
            seq = commits.sequences.take(customer_id(key))
            event = make_event(rng, keys, topic, key=key, seq=seq)
            try:
                await writer.write(event)
            except InDoubtError:
                commits.in_doubt.add(str(event.id))
                continue
            commits.at[str(event.id)] = time.time()
            commits.labels[str(event.id)] = label
            written += 1

    owners = len(writers)
    await asyncio.gather(
        *(write(w, range(i, keys, owners), i / rate) for i, w in enumerate(writers))
    )
    return written / (time.perf_counter() - start)


def split(
    commits: Commits, arrivals: Sequence[Arrival]
) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Per label: commit → consumer and commit → relay send latencies; events not received."""
    latency: dict[str, list[float]] = {}
    pickup: dict[str, list[float]] = {}
    got = 0
    for arrival in arrivals:
        label = commits.labels.get(arrival.ce_id)
        if label is None:
            continue
        got += 1
        committed = commits.at[arrival.ce_id]
        latency.setdefault(label, []).append(arrival.at - committed)
        pickup.setdefault(label, []).append(arrival.sent - committed)
    return latency, pickup, len(commits.at) - got


def pickup_figures(values: Sequence[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:.1f} ms, p99 {pct(values, 0.99) * 1000:.1f} ms"


async def topic_ends(ctx: Ctx, topic: str) -> dict[int, int]:
    """Each partition's high watermark: what is published from now on lies beyond it, whether an
    earlier transaction is still open or not."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=ctx.bootstrap,
        isolation_level="read_uncommitted",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets([KafkaTP(topic, p) for p in range(ctx.args.partitions)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def read_back(
    ctx: Ctx, topic: str, since: dict[int, int], within: float = 300
) -> list[Published]:
    """Every bench event on ``topic`` from ``since`` (partition → offset, :func:`topic_ends`) to
    the end, as a consumer reads it (``read_committed``), re-deliveries included."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=ctx.bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        tps = [KafkaTP(topic, p) for p in range(ctx.args.partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, since.get(tp.partition, 0))
        ends = await consumer.end_offsets(tps)
        found: list[Published] = []
        async with asyncio.timeout(within):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                batches = await consumer.getmany(*tps, timeout_ms=500)
                for tp, records in batches.items():
                    for record in records:
                        key, seq = key_and_seq(record.key, record.value)
                        if seq >= 0:
                            found.append(Published(tp.partition, record.offset, key, seq))
        return found
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def latency_run(ctx: Ctx, phase: str) -> AsyncIterator[tuple[LatencyConsumer, Relays]]:
    """The latency topic ready and empty, its consumer started, one relay publishing it."""
    await ensure_topic(ctx, LATENCY_TOPIC, ctx.args.partitions)
    await ctx.outbox.register_topic(LATENCY_TOPIC, ctx.args.partitions)
    await ctx.outbox.clear()
    async with (
        LatencyConsumer(ctx, LATENCY_TOPIC, phase) as consumer,
        running_relays(ctx, 1, LATENCY_TOPIC, f"bench-{phase}-{ctx.run_id}") as relays,
    ):
        yield consumer, relays
