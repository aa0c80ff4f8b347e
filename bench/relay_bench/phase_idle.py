"""Phase ``idle``: one event at a time into an idle relay, woken by the writer's commit.

Before each of ``--idle-events`` events the relay has declared every partition waiting (on
MongoDB, which has no such declaration: nothing is pending); the event's commit wakes it
(PostgreSQL: NOTIFY; MongoDB: the change stream). Commit → consumer and commit → relay send,
as in ``steady``. And Kafka's part alone, the floor under the relay's, measured first: one
transactional producer, one record per transaction (begin + AddPartitionsToTxn + Produce until
acknowledged, then EndTxn), warm (one every 20 ms) and after the same ``--idle-gap`` as the
relay's events (a client and a broker that sat idle, as the relay's did), over the listener the
relay uses (``--kafka-security``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import time

from aiokafka.errors import KafkaError

from bench.relay_bench.consumer import Commits, latency_run, paced_writes, pickup_figures, split
from bench.relay_bench.harness import (
    CEILING_TOPIC,
    LATENCY_TOPIC,
    Ctx,
    Result,
    ensure_topic,
    latency_figures,
    pct,
    relay_cpu_per_event,
    say,
    stage_breakdown,
    transactional_producer,
)

WAKEUP = {"postgresql": "NOTIFY", "mongodb": "change stream"}
#: Commit → consumer p50 target, milliseconds, and the issue that set it.
TARGETS = {"postgresql": (5.0, ""), "mongodb": (8.0, "#27")}


async def phase_idle(ctx: Ctx) -> None:
    args = ctx.args
    commits = Commits()
    rng = random.Random(5)
    # First, so that the broker is as warm for the relay as for this measurement.
    try:
        whole, send, commit, cpu_ms = await _kafka_alone(ctx, 0.02, 200)
        after_gap = await _kafka_alone(ctx, args.idle_gap, args.idle_events)
        ctx.figures["idle kafka alone"] = whole / 1000
        floor = (
            f"Kafka alone: a one-record transaction p50 {whole:.2f} ms, "
            f"{after_gap[0]:.2f} ms after {args.idle_gap:g} s idle"
        )
        detail = (
            f" (warm: begin, AddPartitionsToTxn, Produce {send:.2f} ms; EndTxn {commit:.2f} ms;"
            f" after the gap: {after_gap[1]:.2f} and {after_gap[2]:.2f} ms);"
            f" aiokafka's CPU {cpu_ms:.2f} ms per transaction"
        )
    except KafkaError as exc:  # a broker without transactions (Tansu)
        floor, detail = "Kafka alone: not measured", f" ({exc!r})"
    async with latency_run(ctx, "idle") as (consumer, relays):
        [writer] = await ctx.outbox.writers(1)
        metrics0 = await relays.metrics_text()
        snap = ctx.cpu.snapshot({"relays": relays.pids, "bench": [os.getpid()]})
        try:
            for _ in range(args.idle_events):
                deadline = time.monotonic() + 10
                while not await ctx.outbox.relays_idle(LATENCY_TOPIC, args.partitions):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the relay did not go idle within 10 s")
                    await asyncio.sleep(0.02)
                await asyncio.sleep(args.idle_gap)  # idle for a while: no batch to join
                await paced_writes(
                    [writer],
                    commits,
                    "idle",
                    1.0,
                    1.0,
                    rng=rng,
                    keys=args.keys,
                    topic=LATENCY_TOPIC,
                )
            with contextlib.suppress(TimeoutError):
                await consumer.wait_for(len(commits.at), 30)
            after = ctx.cpu.snapshot({"relays": relays.pids, "bench": [os.getpid()]})
            metrics1 = await relays.metrics_text()
        finally:
            await writer.close()
    latency, pickup, missing = split(commits, await consumer.arrivals())
    idle = latency.get("idle", [])
    stages = stage_breakdown(metrics0, metrics1)
    cpu = relay_cpu_per_event(snap, after, len(idle))
    if idle:
        ctx.figures["idle p50"] = pct(idle, 0.5)
    p50_ms, issue = TARGETS[ctx.database]
    verdict = "met" if pct(idle, 0.5) * 1000 <= p50_ms else "NOT met"  # NaN (no data): not met
    target = f"target{f' ({issue})' if issue else ''} p50 ≤ {p50_ms:g} ms: {verdict}"
    say(
        f"idle: {len(idle)} events, commit→consumer {latency_figures(idle)}; commit→relay send "
        f"{pickup_figures(pickup.get('idle', []))}; missing {missing}; {cpu} (idle time included)"
    )
    say(f"  relay {stages}")
    say(f"  {floor}{detail}")
    say(f"  {target}")
    ctx.add(
        Result(
            "idle",
            f"1 event at a time ({WAKEUP.get(ctx.database, 'wake-up')}) x{len(idle)}",
            latency_figures(idle),
            note=f"{target}; commit→send {pickup_figures(pickup.get('idle', []))}; {floor}",
        )
    )


async def _kafka_alone(
    ctx: Ctx, gap: float, transactions: int
) -> tuple[float, float, float, float]:
    """p50 milliseconds of a one-record transaction ``gap`` seconds after the last one, of its
    send and of its commit; and the client's CPU milliseconds per transaction (the floor under
    the relay's CPU per cycle)."""
    await ensure_topic(ctx, CEILING_TOPIC, ctx.args.partitions)
    producer = transactional_producer(ctx, "idle-floor")
    await producer.start()
    wholes, sends, commits = [], [], []
    cpu = 0.0
    try:
        for i in range(transactions + 20):  # the first 20 warm up
            await asyncio.sleep(gap if i >= 20 else 0.02)
            cpu_began = time.process_time()
            began = time.perf_counter()
            await producer.begin_transaction()
            sent = await producer.send(
                CEILING_TOPIC, b"{}", key=b"floor", partition=i % ctx.args.partitions
            )
            await sent
            acked = time.perf_counter()
            await producer.commit_transaction()
            ended = time.perf_counter()
            if i >= 20:
                cpu += time.process_time() - cpu_began
                wholes.append((ended - began) * 1000)
                sends.append((acked - began) * 1000)
                commits.append((ended - acked) * 1000)
    finally:
        await producer.stop()
    return (
        statistics.median(wholes),
        statistics.median(sends),
        statistics.median(commits),
        cpu / transactions * 1000,
    )
