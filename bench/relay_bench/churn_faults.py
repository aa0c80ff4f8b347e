"""The churn phase's ``faults`` case: relays killed at random and replaced by fresh processes,
while the other things a bad hour brings happen too, one after another:

- ``broker``: the Kafka broker is SIGKILLed and restarted 7.5 s later (same ports and data);
- ``terminate``: every relay connection is ended by the server (PostgreSQL
  ``pg_terminate_backend``; n/a on MongoDB, whose ``restart`` covers it);
- ``restart``: the database server restarts (a clean shutdown, then a start);
- ``sigstop``: one relay is frozen (SIGSTOP) for 16 s, then resumed (SIGCONT): it is alive to
  the database (its connections stay open) but silent to Kafka.

Writers reconnect when the database goes away; an event whose commit was cut off is *in doubt*
(it may or may not be committed) and is neither expected nor timed (``Commits.in_doubt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from pymongo.errors import PyMongoError

from bench.relay_bench.consumer import InDoubtError
from bench.relay_bench.harness import Ctx, group_state, say
from bench.relay_bench.outbox import BenchOutbox, Writer
from bench.relay_bench.relays import SubprocessRelays
from outboxkit.schemas import Event

FAULTS = ("broker", "terminate", "restart", "sigstop")

#: When each fault begins, as a fraction of the writing time.
_SCHEDULE = {"broker": 0.15, "terminate": 0.35, "restart": 0.5, "sigstop": 0.65}
BROKER_DOWN = 7.5
FROZEN = 16.0

_DATABASE_ERRORS = (psycopg.Error, PyMongoError, OSError)


class ReconnectingWriter:
    """A :class:`Writer` that survives its database going away: the write that was cut off
    raises :class:`InDoubtError`, and the next one waits for a new connection."""

    def __init__(self, outbox: BenchOutbox) -> None:
        self._outbox = outbox
        self._writer: Writer | None = None

    async def write(self, event: Event) -> None:
        while self._writer is None:
            try:
                (self._writer,) = await self._outbox.writers(1)
            except _DATABASE_ERRORS:
                await asyncio.sleep(0.2)
        try:
            await self._writer.write(event)
        except _DATABASE_ERRORS as exc:
            await self.close()
            raise InDoubtError(str(exc)) from exc

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(*_DATABASE_ERRORS):
                await writer.close()


@dataclass
class Faults:
    """Runs the chosen faults on their schedule; :attr:`frozen` names the relay the killer must
    leave alone (a frozen process cannot be killed and replaced in the same way)."""

    ctx: Ctx
    relays: SubprocessRelays
    chosen: Sequence[str]
    seconds: float
    frozen: set[int] = field(default_factory=set)
    log: list[str] = field(default_factory=list)
    #: How the relays' group changed during the run (:func:`watch_group`).
    group_changes: list[str] = field(default_factory=list)

    async def run(self, began: float) -> None:
        async with asyncio.TaskGroup() as group:
            for name in self.chosen:
                group.create_task(self._at(began + _SCHEDULE[name] * self.seconds, name, began))

    async def _at(self, when: float, name: str, began: float) -> None:
        await asyncio.sleep(max(0.0, when - time.time()))
        start = time.time()
        note = await getattr(self, f"_{name}")()
        self.log.append(
            f"{name} at {start - began:.1f} s, {time.time() - start:.1f} s long{note and ': '}"
            f"{note}"
        )

    async def _broker(self) -> str:
        cluster = self.ctx.kafka_cluster
        if cluster is None:
            return "n/a (Kafka given by --kafka)"
        node = cluster.nodes[0]
        await asyncio.to_thread(node.kill)
        await asyncio.sleep(BROKER_DOWN)
        await asyncio.to_thread(node.start)
        return f"node {node.node_id} SIGKILLed, {BROKER_DOWN:g} s down"

    async def _terminate(self) -> str:
        if self.ctx.database != "postgresql":
            return f"n/a on {self.ctx.database}"
        async with await psycopg.AsyncConnection.connect(self.ctx.outbox.url) as conn:
            cursor = await conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE 'outboxkit-relay%'"
            )
            row = await cursor.fetchone()
        return f"{row[0] if row else 0} relay connections ended"

    async def _restart(self) -> str:
        server = self.ctx.database_server
        if server is None:
            return "n/a (database given by URL)"
        await asyncio.to_thread(server.restart, "fast")
        return "clean shutdown and start"

    async def _sigstop(self) -> str:
        victim = random.Random(3).randrange(self.relays.n)
        self.frozen.add(victim)
        try:
            self.relays.signal(victim, signal.SIGSTOP)
            await asyncio.sleep(FROZEN)
        finally:
            self.relays.signal(victim, signal.SIGCONT)
            self.frozen.discard(victim)
        return f"relay {victim} frozen {FROZEN:g} s"


async def kill_at_random(
    relays: SubprocessRelays, faults: Faults | None, stop: asyncio.Event, rng: random.Random
) -> int:
    """SIGKILL a random relay every 2-4 s and start a fresh process in its place at once (a
    pod replaced by its controller); the frozen relay is spared. Returns how many were killed."""
    kills = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(2.0, 4.0))
        if stop.is_set():
            return kills
        spared = faults.frozen if faults is not None else set()
        victims = [i for i in range(relays.n) if i not in spared]
        victim = rng.choice(victims)
        await relays.kill(victim)
        await relays.start_one(victim)
        kills += 1
    return kills


def say_timeline(latencies: Sequence[tuple[float, float]], began: float, window: float) -> None:
    """Commit → consumer latency of the events committed in each ``window`` of the writes:
    where publishing stalled, and for how long."""
    buckets: dict[int, list[float]] = {}
    for committed, latency in latencies:
        buckets.setdefault(int((committed - began) // window), []).append(latency)
    for index in sorted(buckets):
        values = sorted(buckets[index])
        p50 = values[len(values) // 2]
        p99 = values[int(0.99 * (len(values) - 1))]
        say(
            f"  committed {index * window:5.0f}-{(index + 1) * window:<4.0f}s: {len(values):5} "
            f"events, commit→consumer p50 {p50:6.2f} s, p99 {p99:6.2f} s, max {values[-1]:6.2f} s"
        )


async def watch_group(
    ctx: Ctx, relays: SubprocessRelays, group: str, stop: asyncio.Event, began: float
) -> list[str]:
    """The relays' consumer group each second, as its state and member count change, beside how
    many relay processes run: a group that keeps more members than processes is waiting for
    dead ones to time out."""
    changes: list[str] = []
    last: tuple[int, str, int] | None = None
    while not stop.is_set():
        members, state = await group_state(ctx, group)
        now = (members, state, len(relays.pids))
        if now != last:
            changes.append(
                f"{time.time() - began:6.1f} s: {state}, {members} members, {now[2]} processes"
            )
            last = now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return changes
