"""Phase ``steady``: commit → consumer latency at a steady rate, with the per-stage breakdown.

``--latency-writers`` writers each commit one event per transaction (the product's writer),
paced to ``--rate`` events/s in all (a late writer does not burst to catch up), for
``--latency-seconds`` after a 2 s warm-up; one relay publishes; a ``read_committed`` consumer
in a child process stamps each record's arrival. Latency = arrival - the writer's COMMIT return,
matched by event id; commit → send uses the record's Kafka timestamp (set by the relay's send,
ms resolution). The relay's own metrics give the time per stage of its cycles (wake-up, pacing,
claim, send, commit) and its histogram of insert → Kafka commit; the relay process's CPU time is
divided by the events of the steady window. Every record the consumer received (warm-up
included) is checked for per-key order (``order.py``; each writer owns its keys, so an event's
``seq`` is its key's commit order: ``consumer.paced_writes``). The targets are the database's
(``TARGETS``), each printed with its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from dataclasses import dataclass

from pymongo import AsyncMongoClient

from bench.relay_bench.consumer import (
    Commits,
    latency_run,
    paced_writes,
    pickup_figures,
    split,
)
from bench.relay_bench.harness import (
    LATENCY_TOPIC,
    CpuMeter,
    CpuSnapshot,
    Ctx,
    Result,
    bucket_quantile,
    histogram_buckets,
    latency_figures,
    pct,
    relay_cpu_ms,
    relay_cpu_per_event,
    say,
    stage_breakdown,
)
from bench.relay_bench.outbox_mongodb import MongoBenchOutbox
from outboxkit.core.mongodb import Client

HISTOGRAM = "outboxkit_relay_commit_to_ack_seconds"


@dataclass(frozen=True)
class SteadyTarget:
    p50_ms: float
    p99_ms: float
    #: Relay CPU milliseconds per event.
    cpu_ms: float
    #: The share of ``--rate`` the writers must achieve (None: not part of the target).
    reached: float | None = None
    issue: str = ""

    def judge(self, asked: float, achieved: float, p50: float, p99: float, cpu: float) -> str:
        """The target's text and its verdict, naming what missed; ``p50``/``p99`` in seconds."""
        checks = [
            ("p50", p50 * 1000 <= self.p50_ms),
            ("p99", p99 * 1000 <= self.p99_ms),
            ("CPU", cpu <= self.cpu_ms),
        ]
        text = f"p50 ≤ {self.p50_ms:g} ms, p99 ≤ {self.p99_ms:g} ms, ≤ {self.cpu_ms:g} ms CPU/event"
        if self.reached is not None:
            checks.insert(0, ("rate", achieved >= self.reached * asked))
            text = f"{asked:,.0f}/s reached (≥ {self.reached:g}x), {text}"
        missed = [name for name, ok in checks if not ok]  # a NaN (no data) misses too
        verdict = f"NOT met ({', '.join(missed)})" if missed else "met"
        return f"target{f' ({self.issue})' if self.issue else ''} {text}: {verdict}"


TARGETS = {
    "postgresql": SteadyTarget(10, 50, 0.3),
    "mongodb": SteadyTarget(15, 60, 0.6, reached=0.95, issue="#27"),
}


async def mongod_commands(ctx: Ctx) -> dict[str, int] | None:
    """mongod's command counters (``serverStatus``), on MongoDB."""
    if not isinstance(ctx.outbox, MongoBenchOutbox):
        return None
    client: Client = AsyncMongoClient(ctx.outbox.url)
    try:
        status = await client.admin.command("serverStatus")
    finally:
        await client.close()
    commands = status["metrics"]["commands"]
    return {
        name: int(counts["total"])
        for name, counts in commands.items()
        if isinstance(counts, dict) and "total" in counts
    }


def mongod_per_event(
    snap: CpuSnapshot,
    after: CpuSnapshot,
    before: dict[str, int],
    later: dict[str, int],
    events: int,
) -> str:
    """mongod's CPU and its commands per event of the window (writers' and relay's together;
    the writer phase measures the writers' share alone)."""
    cpu = snap.seconds(after, "mongodb") * 1000 / events
    counts = {name: (later[name] - before.get(name, 0)) / events for name in later}
    shown = sorted(((n, c) for n, c in counts.items() if c >= 0.01), key=lambda item: -item[1])
    return f"{cpu:.3f} ms CPU; commands " + ", ".join(f"{n} {c:.2f}" for n, c in shown)


def report_mongod(
    ctx: Ctx,
    cpu: tuple[CpuSnapshot, CpuSnapshot],
    commands: tuple[dict[str, int] | None, dict[str, int] | None],
    events: int,
) -> None:
    before, later = commands
    if before is None or later is None or not events:
        return
    per_event = mongod_per_event(*cpu, before, later, events)
    say(f"  mongod per event: {per_event}")
    ctx.add(
        Result(
            "steady", "mongod per event (writers + relay)", per_event.split(";")[0], note=per_event
        )
    )


async def phase_steady(ctx: Ctx) -> None:
    args = ctx.args
    commits = Commits()
    rng = random.Random(3)
    async with latency_run(ctx, "steady") as (consumer, relays):
        writers = await ctx.outbox.writers(args.latency_writers)
        try:
            await paced_writes(
                writers,
                commits,
                "warmup",
                args.rate,
                2.0,
                rng=rng,
                keys=args.keys,
                topic=LATENCY_TOPIC,
            )
            metrics0 = await relays.metrics_text()
            groups = {"relays": relays.pids, "bench": [os.getpid()]}
            commands0 = await mongod_commands(ctx)
            snap = ctx.cpu.snapshot(groups)
            achieved = await paced_writes(
                writers,
                commits,
                "steady",
                args.rate,
                args.latency_seconds,
                rng=rng,
                keys=args.keys,
                topic=LATENCY_TOPIC,
            )
            after = ctx.cpu.snapshot(groups)
            commands1 = await mongod_commands(ctx)
            with contextlib.suppress(TimeoutError):
                await consumer.wait_for(len(commits.at), 30)
            await asyncio.sleep(0.5)  # the last batch's settle (for the relay's counters)
            metrics1 = await relays.metrics_text()
        finally:
            for w in writers:
                await w.close()
    latency, pickup, missing = split(commits, await consumer.arrivals())
    violations = ctx.check_order("steady", await consumer.published(commits.labels))
    steady = latency.get("steady", [])
    sends = pickup.get("steady", [])
    events = len([1 for label in commits.labels.values() if label == "steady"])
    cpu = relay_cpu_per_event(snap, after, events)
    target = TARGETS[ctx.database].judge(
        args.rate,
        achieved,
        pct(steady, 0.5),
        pct(steady, 0.99),
        relay_cpu_ms(snap, after, events),
    )
    if steady:
        ctx.figures["steady p50"] = pct(steady, 0.5)
        ctx.figures["steady p99"] = pct(steady, 0.99)
        ctx.figures["steady cpu"] = relay_cpu_ms(snap, after, events)
    late = 100 * len(commits.behind) / max(len(commits.at), 1)
    stages = stage_breakdown(metrics0, metrics1)
    hist0 = histogram_buckets(metrics0, HISTOGRAM)
    hist1 = histogram_buckets(metrics1, HISTOGRAM)
    hist = f"p50 {bucket_quantile(hist0, hist1, 0.5)}, p99 {bucket_quantile(hist0, hist1, 0.99)}"
    send_to_consumer = [lat - pick for lat, pick in zip(steady, sends, strict=True)]
    say(
        f"steady: {args.rate:,.0f}/s asked, {achieved:,.0f}/s achieved by "
        f"{args.latency_writers} writers for {args.latency_seconds:.0f} s ({len(steady)} events; "
        f"{late:.0f}% of writes started late); missing at the consumer: {missing}; "
        f"order violations {violations}; {cpu}; "
        f"{CpuMeter.describe(snap, after)}"
    )
    say(f"  commit→consumer {latency_figures(steady)}")
    say(
        f"  breakdown: commit→relay send {pickup_figures(sends)}; send→consumer p50 "
        f"{pct(send_to_consumer, 0.5) * 1000:.1f} ms; relay {stages}"
    )
    say(f"  relay histogram {HISTOGRAM} (row insert → Kafka commit): {hist}")
    report_mongod(ctx, (snap, after), (commands0, commands1), events)
    say(f"  {target}")
    ctx.add(
        Result(
            "steady",
            f"{achieved:,.0f}/s, commit→consumer",
            latency_figures(steady),
            cpu,
            f"{target}; commit→send {pickup_figures(sends)}; {CpuMeter.describe(snap, after)}",
            order=str(violations),
        )
    )
    ctx.add(Result("steady", "per-stage breakdown (relay)", stages.split(";")[0], note=stages))
    if missing:
        ctx.add(Result("steady", "events not received", str(missing), note="within 30 s"))
