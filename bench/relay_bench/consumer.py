"""Commit → consumer timing: paced writers that note each event's commit time, and a
``read_committed`` consumer in a child process that notes each record's arrival."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from bench.relay_bench.harness import LATENCY_TOPIC, Ctx, ensure_topic, make_event, pct
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
    seen: list[tuple[str, float, int, int]] = []
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
                    ce_id = next((v for k, v in record.headers if k == "ce_id"), b"")
                    seen.append((ce_id.decode(), now, record.timestamp, tp.partition))
                    distinct.add(ce_id.decode())
            if len(distinct) != last_report:
                last_report = len(distinct)
                print(f"count {last_report}", flush=True)
    finally:
        await consumer.stop()
        await asyncio.to_thread(out.write_text, json.dumps(seen))


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
        for ce_id, at, ts, partition in json.loads(text):
            if ce_id not in seen:
                seen[ce_id] = Arrival(str(ce_id), float(at), int(ts) / 1000, int(partition))
        return list(seen.values())


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
    taken when COMMIT returns."""
    period = len(writers) / rate
    per_writer = max(1, round(rate * seconds / len(writers)))
    start = time.perf_counter() + 0.02
    written = 0

    async def write(writer: Writer, offset: float) -> None:
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
            event = make_event(rng, keys, topic)
            await writer.write(event)
            commits.at[str(event.id)] = time.time()
            commits.labels[str(event.id)] = label
            written += 1

    await asyncio.gather(*(write(w, i / rate) for i, w in enumerate(writers)))
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
