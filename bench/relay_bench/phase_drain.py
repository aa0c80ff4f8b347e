"""Phase ``drain``: a backlog of outbox rows drained by 1 and by 3 relays.

``--rows`` rows written by the product's writer (``--keys`` distinct keys, 6 partitions) are
kept aside; each run makes them pending with one commit while the relays are up and idle, so
the commit wakes them, and times how long until nothing is pending. ``--drain-repeat N`` runs
each case N times: the figures spread, and an intermittent stall (a partition that stops moving)
shows up. Every run watches each partition's pending count and notes when it last went down
(its last publish): a partition that stops for ``--stall-report`` seconds is reported while it
happens, with the relays' health, every task's stack and the database's activity and claim plan.

After each run the topic is read back (``read_committed``) and its per-key order checked
(``order.py``): the backlog is many events per key, several of a key in each of the writer's
transactions and all of them made pending by one commit, and each event's ``seq`` is its place
among its key's events in that commit (``BenchOutbox.seed``).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time

from bench.relay_bench.consumer import read_back, topic_ends
from bench.relay_bench.harness import (
    DRAIN_TOPIC,
    CpuMeter,
    Ctx,
    Result,
    ensure_topic,
    metric_sum,
    relay_cpu_ms,
    relay_cpu_per_event,
    say,
    stage_breakdown,
)
from bench.relay_bench.relays import Relays, running_relays


async def phase_drain(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_topic(ctx, DRAIN_TOPIC, args.partitions)
    await ctx.outbox.register_topic(DRAIN_TOPIC, args.partitions)
    # One seed serves the claims phase too (PostgreSQL only), if it runs.
    claims = args.claim_rows if "claims" in args.phases and ctx.database == "postgresql" else 0
    fill = await ctx.outbox.seed(max(args.rows, claims), args.keys, DRAIN_TOPIC)
    if fill:
        ctx.add(Result("drain", "writer add_many, 5000/txn (fill)", f"{fill:,.0f} rows/s"))
    for n in args.relays:
        rates: list[float] = []
        cpus: list[tuple[float, float]] = []
        violations = 0
        for run in range(args.drain_repeat):
            rate, disorder, cpu_ms = await _drain_once(ctx, n, run)
            violations += disorder
            if rate is not None:
                rates.append(rate)
                cpus.append(cpu_ms)
        if rates:
            ctx.drain_rates[n] = statistics.median(rates)
            ctx.figures[f"drain {n} ev/s"] = statistics.median(rates)
            ctx.figures[f"drain {n} cpu"] = statistics.median(c[0] for c in cpus)
            ctx.figures[f"drain {n} kafka cpu"] = statistics.median(c[1] for c in cpus)
        if len(rates) > 1:
            say(
                f"{n} relay(s), {len(rates)} runs: {min(rates):,.0f} / "
                f"{statistics.median(rates):,.0f} / {max(rates):,.0f} events/s (min/median/max)"
            )
            ctx.add(
                Result(
                    "drain",
                    f"{n} relay(s), {len(rates)} runs",
                    f"median {statistics.median(rates):,.0f} ev/s",
                    _ratios(ctx, statistics.median(rates)),
                    f"min {min(rates):,.0f}, max {max(rates):,.0f}",
                    order=f"{violations} in all",
                )
            )


#: The issues' targets on 2 cores (PostgreSQL: #17, 1000 keys, 1 relay; MongoDB: #12, with "≥ 0.5x
#: PostgreSQL's drain in the same run" printed by main when both run).
TARGETS = {
    "postgresql": "target (1000 keys) ≥ 15K ev/s, ≥ 0.5x plain",
    "mongodb": "target ≥ 5K ev/s",
}


def _ratios(ctx: Ctx, rate: float) -> str:
    parts = []
    if ctx.ceiling_plain:
        parts.append(f"{rate / ctx.ceiling_plain:.2f}x plain")
    if ctx.ceiling_txn:
        parts.append(f"{rate / ctx.ceiling_txn:.2f}x txn")
    return ", ".join(parts) or "(no ceiling run)"


async def _drain_once(ctx: Ctx, n: int, run: int) -> tuple[float | None, int, tuple[float, float]]:
    """One drain: its rate (None if it did not drain), the order violations read back, and the
    CPU milliseconds per event of the relays and of the broker."""
    args = ctx.args
    group = f"bench-drain{n}-{ctx.run_id}-{run}"
    await ctx.outbox.clear()
    since = await topic_ends(ctx, DRAIN_TOPIC)
    t_start = time.perf_counter()
    async with running_relays(ctx, n, DRAIN_TOPIC, group) as relays:
        startup = time.perf_counter() - t_start
        metrics0 = await relays.metrics_text()
        snap = ctx.cpu.snapshot({"relays": relays.pids})
        # A commit makes the backlog visible and wakes the idle relays (PostgreSQL: one, the
        # trigger NOTIFYs every waiting partition; MongoDB: one per 30,000 documents, timed
        # from the first).
        t0 = await ctx.outbox.load_backlog(args.rows)
        stuck, worst = await _wait_drained(ctx, relays, group)
        elapsed = time.perf_counter() - t0
        after = ctx.cpu.snapshot({"relays": relays.pids})
        metrics1 = await relays.metrics_text()
    label = f"{n} relay(s) ({args.relay_mode})" + (
        f", run {run + 1}" if args.drain_repeat > 1 else ""
    )
    published = await read_back(ctx, DRAIN_TOPIC, since)
    violations = ctx.check_order(f"drain, {label}", published)
    events = len({(record.key, record.seq) for record in published})
    read = f"read back {len(published):,} records, {events:,} events; order violations {violations}"
    if stuck:
        say(f"{label}: NOT DRAINED after {elapsed:.0f} s: {stuck}; {read}")
        ctx.keep_workdir = True
        ctx.add(Result("drain", label, "did not drain", note=stuck, order=str(violations)))
        return None, violations, (math.nan, math.nan)
    sent = metric_sum(metrics1, "outboxkit_relay_published_total") - metric_sum(
        metrics0, "outboxkit_relay_published_total"
    )
    batches = metric_sum(metrics1, "outboxkit_relay_batches_total") - metric_sum(
        metrics0, "outboxkit_relay_batches_total"
    )
    rate = float(args.rows) / elapsed
    per_batch = sent / batches if batches else float("nan")
    cpu = relay_cpu_per_event(snap, after, args.rows)
    say(
        f"{label}: {args.rows:,} rows in {elapsed:.2f} s = {rate:,.0f} events/s, "
        f"{_ratios(ctx, rate)}; {read}; "
        f"{batches:.0f} Kafka transactions, {per_batch:.0f} records each; "
        f"longest a partition did not move: {worst:.1f} s; startup {startup:.1f} s; {cpu}; "
        f"{CpuMeter.describe(snap, after)}"
    )
    say(f"  stages: {stage_breakdown(metrics0, metrics1)}")
    ctx.add(
        Result(
            "drain",
            f"{label}, {args.rows // 1000}K backlog",
            f"{rate:,.0f} ev/s",
            _ratios(ctx, rate),
            f"{TARGETS.get(ctx.database, '')}; {per_batch:.0f} rec/txn; {cpu}; "
            f"max stall {worst:.1f} s; "
            f"{CpuMeter.describe(snap, after)}",
            order=str(violations),
        )
    )
    kafka_ms = snap.seconds(after, "kafka") * 1000 / args.rows
    return rate, violations, (relay_cpu_ms(snap, after, args.rows), kafka_ms)


#: How often the pending rows are counted while a drain runs, and near its end: once fewer rows
#: are left than the last interval drained, every FINAL_POLL, so that the end is found within
#: it (a 30K backlog drains in about a second).
POLL, FINAL_POLL = 0.25, 0.02


async def _wait_drained(ctx: Ctx, relays: Relays, group: str) -> tuple[str | None, float]:
    """Until nothing is pending. Returns what is left if that takes more than
    ``--drain-timeout``, and the longest time any partition went without a publish."""
    args = ctx.args
    start = time.perf_counter()
    left: int | None = None
    near_end = False
    counts: dict[int, int] = {}
    moved: dict[int, float] = {}
    reported: set[int] = set()
    worst = 0.0
    while True:
        relays.check_alive()
        now = time.perf_counter()
        pending = await ctx.outbox.pending_by_partition(DRAIN_TOPIC)
        if not pending:
            return None, worst
        for part, count in pending.items():
            if counts.get(part) != count:
                counts[part], moved[part] = count, now
                reported.discard(part)
            still = now - moved[part]
            worst = max(worst, still)
            if still >= args.stall_report and part not in reported:
                reported.add(part)
                await _report_stall(ctx, relays, group, part=part, still=still, pending=pending)
        for part in list(counts):
            if part not in pending:  # drained: its last publish was the last move
                del counts[part]
        if now - start > args.drain_timeout:
            rows = ", ".join(f"{p}: {n}" for p, n in sorted(pending.items()))
            return f"pending rows left after {now - start:.0f} s: {rows}", worst
        total = sum(pending.values())
        near_end = near_end or (left is not None and total < left - total)
        left = total
        await asyncio.sleep(FINAL_POLL if near_end else POLL)


async def _report_stall(
    ctx: Ctx, relays: Relays, group: str, *, part: int, still: float, pending: dict[int, int]
) -> None:
    ctx.keep_workdir = True
    text = (
        f"partition {part} has not moved for {still:.1f} s (pending per partition: "
        f"{dict(sorted(pending.items()))})\n"
        + await ctx.outbox.diagnostics(DRAIN_TOPIC)
        + "\n"
        + await relays.diagnose()
    )
    path = ctx.workdir / f"stall-{group}-p{part}.txt"
    await asyncio.to_thread(path.write_text, text)
    say(f"  STALL: partition {part} has not moved for {still:.1f} s; diagnostics in {path}")
