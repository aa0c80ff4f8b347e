"""Phase ``idle``: one event at a time into an idle relay, woken by the writer's commit.

Before each of ``--idle-events`` events the relay has declared every partition waiting (on
MongoDB, which has no such declaration: nothing is pending); the event's commit wakes it
(PostgreSQL: NOTIFY; MongoDB: the change stream). Commit → consumer and commit → relay send,
as in ``steady``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time

from bench.relay_bench.consumer import Commits, latency_run, paced_writes, pickup_figures, split
from bench.relay_bench.harness import (
    LATENCY_TOPIC,
    Ctx,
    Result,
    latency_figures,
    relay_cpu_per_event,
    say,
    stage_breakdown,
)

WAKEUP = {"postgresql": "NOTIFY", "mongodb": "change stream"}


async def phase_idle(ctx: Ctx) -> None:
    args = ctx.args
    commits = Commits()
    rng = random.Random(5)
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
    say(
        f"idle: {len(idle)} events, commit→consumer {latency_figures(idle)}; commit→relay send "
        f"{pickup_figures(pickup.get('idle', []))}; missing {missing}; {cpu} (idle time included)"
    )
    say(f"  relay {stages}")
    ctx.add(
        Result(
            "idle",
            f"1 event at a time ({WAKEUP.get(ctx.database, 'wake-up')}) x{len(idle)}",
            latency_figures(idle),
            note=f"target p50 ≤ 5 ms; commit→send {pickup_figures(pickup.get('idle', []))}",
        )
    )
