"""Phase ``churn``: three relays, one of them SIGKILLed and restarted every few seconds.

Writers commit ``--churn-rate`` events/s for ``--churn-seconds`` while, every ``--churn-every``
seconds, the next relay (round robin) is killed with SIGKILL and started again at once. Then the
killing stops and everything is read back. Figures: commit → consumer p50/p99/max, the longest a
partition received nothing while events were being written (its outage), events missing, and
per-key order violations (``order.py``; each writer owns its keys, so an event's ``seq`` is its
key's commit order: ``consumer.paced_writes``).
Three cases (``--churn-modes``):

- ``dynamic``, the default configuration: dynamic membership, and a survivor removes a killed
  relay's member from the group as soon as PostgreSQL has ended its session
  (``OUTBOXKIT_DEPARTED_CHECK_INTERVAL``);
- ``kafka-only``: dynamic membership with that check off, so a killed relay's member stays in
  the group until its session times out, and every rebalance waits for it;
- ``static``: static membership (``OUTBOXKIT_INSTANCE_ID``): the restarted relay takes its
  member's place, and its partitions, without a rebalance;
- ``faults``: dynamic membership, a random relay killed every 2-4 s and replaced by a fresh
  process, plus a broker kill, the relays' connections ended, a database restart and a frozen
  relay, one after another (``churn_faults.py``; ``--churn-faults`` picks some of them).
  Its figures include the latency of the events committed in each 10 s of the run;
- ``faults-static``: the same with static membership.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import defaultdict

from bench.relay_bench.churn_faults import (
    Faults,
    ReconnectingWriter,
    kill_at_random,
    say_timeline,
    watch_group,
)
from bench.relay_bench.consumer import Arrival, Commits, LatencyConsumer, paced_writes, split
from bench.relay_bench.harness import (
    CHURN_TOPIC,
    Ctx,
    Result,
    ensure_topic,
    latency_figures,
    say,
)
from bench.relay_bench.outbox import Writer
from bench.relay_bench.relays import SubprocessRelays, wait_ready

RELAYS = 3
#: Writer connections (each owns ``1/WRITERS`` of the keys).
WRITERS = 8

_MODES = {
    "dynamic": "dynamic membership",
    "kafka-only": "dynamic membership, database check off",
    "static": "static membership",
    "faults": "dynamic membership, random kills and other faults",
    "faults-static": "static membership, random kills and other faults",
}


async def phase_churn(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_topic(ctx, CHURN_TOPIC, args.partitions)
    await ctx.outbox.register_topic(CHURN_TOPIC, args.partitions)
    for mode in args.churn_modes:
        await _churn(ctx, mode)


async def _churn(ctx: Ctx, mode: str) -> None:
    args = ctx.args
    await ctx.outbox.clear()
    group = f"bench-churn-{mode}-{ctx.run_id}"
    session = args.churn_session_timeout
    relays = SubprocessRelays(
        ctx,
        RELAYS,
        CHURN_TOPIC,
        group,
        instance_ids=mode in ("static", "faults-static"),
        session_timeout=str(session),
        departed_check_interval="0" if mode == "kafka-only" else "1",
        heartbeat_interval=str(min(1.0, session / 3)),
    )
    commits = Commits()
    kills = 0
    faults: Faults | None = None
    async with LatencyConsumer(ctx, CHURN_TOPIC, f"churn-{mode}") as consumer:
        await relays.start()
        try:
            await wait_ready(ctx, relays, RELAYS, CHURN_TOPIC, f"outboxkit.relay.{group}")
            if mode.startswith("faults"):
                faults = Faults(ctx, relays, args.churn_faults, args.churn_seconds)
                writers: list[Writer] = [ReconnectingWriter(ctx.outbox) for _ in range(WRITERS)]
            else:
                writers = list(await ctx.outbox.writers(WRITERS))
            stop = asyncio.Event()
            began = time.time()
            killing = asyncio.create_task(
                kill_at_random(relays, faults, stop, random.Random(5))
                if faults is not None
                else _kill_round_robin(relays, args.churn_every, stop)
            )
            faulting = asyncio.create_task(faults.run(began)) if faults is not None else None
            watching = (
                asyncio.create_task(
                    watch_group(ctx, relays, f"outboxkit.relay.{group}", stop, began)
                )
                if faults is not None
                else None
            )
            try:
                await paced_writes(
                    writers,
                    commits,
                    "churn",
                    args.churn_rate,
                    args.churn_seconds,
                    rng=random.Random(9),
                    keys=args.keys,
                    topic=CHURN_TOPIC,
                )
            finally:
                stop.set()
                kills = await killing
                if faulting is not None:
                    await faulting
                if watching is not None and faults is not None:
                    faults.group_changes = await watching
                for w in writers:
                    await w.close()
            ended = time.time()
            with contextlib.suppress(TimeoutError):
                await consumer.wait_for(len(commits.at), 180)
            if consumer.received < len(commits.at):
                # Some partition stopped moving: where do the live relays wait?
                (ctx.workdir / f"churn-{mode}-diagnosis.txt").write_text(await relays.diagnose())
        finally:
            await relays.stop()
    await _report(ctx, mode, consumer, commits, faults=faults, writing=(began, ended), kills=kills)


async def _kill_round_robin(relays: SubprocessRelays, every: float, stop: asyncio.Event) -> int:
    """SIGKILL the next relay every ``every`` seconds and start it again at once."""
    victim, killed = 0, 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            break
        await relays.kill(victim)
        await relays.start_one(victim)
        killed += 1
        victim = (victim + 1) % RELAYS
    return killed


async def _report(
    ctx: Ctx,
    mode: str,
    consumer: LatencyConsumer,
    commits: Commits,
    *,
    faults: Faults | None,
    writing: tuple[float, float],
    kills: int,
) -> None:
    args = ctx.args
    session = args.churn_session_timeout
    began, ended = writing
    arrivals = await consumer.arrivals()
    latency, _, missing = split(commits, arrivals)
    violations = ctx.check_order(f"churn, {mode}", await consumer.published(commits.labels))
    values = latency.get("churn", [])
    outage, worst_partition = _longest_outage(arrivals, commits, began, ended)
    if missing:
        await _say_missing(ctx, commits, arrivals)
    if faults is not None:
        ctx.keep_workdir = True  # the relays' logs show what each fault did to them
        for line in faults.log:
            say(f"  fault: {line}")
        say(f"  {len(commits.in_doubt)} writes in doubt (the database went away at commit)")
        say("  the relays' group, as it changed:")
        for line in faults.group_changes:
            say(f"    {line}")
        say_timeline(
            [
                (commits.at[a.ce_id], a.at - commits.at[a.ce_id])
                for a in arrivals
                if commits.labels.get(a.ce_id) == "churn"
            ],
            began,
            10.0,
        )
    say(
        f"churn ({_MODES[mode]}, session timeout {session:g} s): {kills} kills in "
        f"{ended - began:.0f} s of writes ({args.churn_seconds:.0f} s planned), "
        f"{len(values)} events; commit→consumer "
        f"{latency_figures(values)}; longest partition outage {outage:.1f} s (partition "
        f"{worst_partition}); missing {missing}; order violations {violations}"
    )
    ctx.add(
        Result(
            "churn",
            f"{_MODES[mode]}, kill+restart every "
            f"{'2-4' if faults is not None else f'{args.churn_every:g}'} s",
            latency_figures(values),
            f"p99 {(_p99(values) / session):.1f}x session timeout",
            f"session timeout {session:g} s; longest partition outage {outage:.1f} s; "
            f"{kills} kills; missing {missing}",
            order=str(violations),
        )
    )


async def _say_missing(ctx: Ctx, commits: Commits, arrivals: list[Arrival]) -> None:
    """Lost (nowhere) or stuck (still pending)? Say which, and keep the relays' logs."""
    received = {a.ce_id for a in arrivals}
    absent = [e for e in commits.at if e not in received]
    states = await ctx.outbox.states(absent)
    ctx.keep_workdir = True
    for event_id in absent[:20]:
        say(f"  missing {event_id}: {states.get(event_id, 'not in the outbox')}")


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan")


def _longest_outage(
    arrivals: list[Arrival], commits: Commits, began: float, ended: float
) -> tuple[float, int]:
    """The longest time a partition received nothing while it had events committed and not yet
    received (between the first write and the end of the writes)."""
    per_partition: dict[int, list[float]] = defaultdict(list)
    for arrival in arrivals:
        if commits.labels.get(arrival.ce_id) == "churn":
            per_partition[arrival.partition].append(arrival.at)
    worst, where = 0.0, -1
    for partition, received in per_partition.items():
        for earlier, later in itertools.pairwise(sorted([began, *received])):
            if earlier <= ended and later - earlier > worst:
                worst, where = later - earlier, partition
    return worst, where
