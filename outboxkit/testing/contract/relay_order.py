"""Per-key order (G2) at the storage level: the same tests for every backend
(:class:`RelayOrderContract`, with a ``relay_backend`` fixture).

Transactions written the way services write them (several ``outbox.add`` calls, ``add_many``,
more events of a key than the claim depth, keys interleaved, rollbacks, transactions begun
early and committed late) are drained by a simulated relay that calls the storage exactly as
:mod:`outboxkit.relay.worker` does: claim with a depth (settling the last batch in the same
call), split the claim with :func:`~outboxkit.relay.batches.by_depth`, and for each rank settle
the one before, then publish it. The :class:`Ledger` checks every call as it returns:

- a claim returns, of each key, a run of its records starting at its oldest unsettled one, in
  commit order, none skipped (so never a record while an older one of its key is unsettled);
- a record is published only once every older record of its key is published and settled;
- once drained, each key's published sequence is its commit order exactly: nothing lost,
  nothing twice, nothing of a rolled-back transaction.

"Commit order" of a key is well defined because a key is written by one transaction at a time:
PostgreSQL does not serialise two concurrent writers of a key (G2 holds for a key's events
written in series), and on MongoDB a second writer of a key held by an open transaction would
retry until that one ends. A transaction held open reserves its keys until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxkit.backends import Transactions
from outboxkit.relay import OutboxRecord, OutboxStorage, RelaySettings, TopicPartition, by_depth
from outboxkit.schemas import Event, partition_for_key
from outboxkit.testing.contract.backend import RelayBackend

PARTITIONS = 2
DEPTHS = range(1, 9)
BATCH_SIZES = [1, 2, 3, 10]
#: Transactions held open at once, at most (each keeps a PostgreSQL connection).
MAX_HELD = 2

#: A fresh topic for every run, so that runs (and hypothesis examples) share no records.
_runs = itertools.count()


class Step(Event, type="contract.order_step", topic="order", key_field="entity"):
    entity: str
    seq: int  #: the key's events numbered in the order they were added


def keys_on(partition: int, count: int) -> list[str]:
    """``count`` entity names whose key lands on ``partition``."""
    names = (f"k{i}" for i in itertools.count())
    return list(
        itertools.islice((n for n in names if partition_for_key(n, PARTITIONS) == partition), count)
    )


#: Four keys on partition 0, three on partition 1.
KEYS = [*keys_on(0, 4), *keys_on(1, 3)]

#: The keys of one writer call's events: one key is ``outbox.add``, more ``outbox.add_many``.
Call = tuple[str, ...]


class RolledBack(Exception):
    """Raised inside a transaction to roll it back."""


#: A backend's relay storage and its writers' transactions.
Parts = tuple[OutboxStorage, Transactions]


# -- bookkeeping and checks -----------------------------------------------------------------------


@dataclass
class Ledger:
    """What was committed, and what the simulated relay was given, published and settled."""

    depth: int
    limit: int
    next_seq: dict[str, int] = field(default_factory=dict)
    committed: dict[str, list[int]] = field(default_factory=dict)
    published: dict[str, list[int]] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)

    def where(self) -> str:
        return f"[claim depth {self.depth}, batch size {self.limit}]"

    def events(self, topic: str, calls: Sequence[Call]) -> list[list[Step]]:
        """The events of ``calls``, each key's numbered on from its last."""
        made: list[list[Step]] = []
        for call in calls:
            made.append([])
            for key in call:
                seq = self.next_seq.get(key, 0)
                self.next_seq[key] = seq + 1
                made[-1].append(Step(entity=key, seq=seq, topic=topic))
        return made

    def commit(self, events: Sequence[Sequence[Step]]) -> None:
        for event in itertools.chain.from_iterable(events):
            self.committed.setdefault(event.entity, []).append(event.seq)

    def claimed(self, records: Sequence[OutboxRecord]) -> None:
        runs: dict[str, list[int]] = {}
        keys_of: dict[int, set[str]] = {}
        for record in records:
            step = _step(record)
            runs.setdefault(step.entity, []).append(step.seq)
            keys_of.setdefault(record.partition, set()).add(step.entity)
        for key, seqs in runs.items():
            start = self.settled.get(key, 0)
            oldest = self.committed.get(key, [])[start : start + len(seqs)]
            assert seqs == oldest, (
                f"{self.where()} key {key}: settle_and_claim returned {seqs}, but its oldest "
                f"unsettled records are {oldest} (committed {self.committed.get(key, [])}, "
                f"the first {start} settled)"
            )
            assert len(seqs) <= self.depth, f"{self.where()} key {key}: {seqs}, beyond the depth"
        for partition, keys in keys_of.items():
            assert len(keys) <= self.limit, f"{self.where()} partition {partition}: keys {keys}"

    def publish(self, rank: Sequence[OutboxRecord]) -> None:
        for record in rank:
            step = _step(record)
            done = self.published.setdefault(step.entity, [])
            settled = self.settled.get(step.entity, 0)
            assert settled == len(done), (
                f"{self.where()} key {step.entity}: #{step.seq} published while {done[settled:]} "
                f"of its older records are not settled"
            )
            done.append(step.seq)
            committed = self.committed.get(step.entity, [])
            assert done == committed[: len(done)], (
                f"{self.where()} key {step.entity}: published {done}, commit order {committed}"
            )

    def settle(self, records: Sequence[OutboxRecord]) -> None:
        for record in records:
            step = _step(record)
            settled = self.settled.get(step.entity, 0)
            assert self.published[step.entity][settled] == step.seq
            self.settled[step.entity] = settled + 1

    def all_published(self) -> bool:
        return all(
            len(self.published.get(key, [])) == len(seqs) for key, seqs in self.committed.items()
        )

    def check_complete(self) -> None:
        """Every key published exactly in its commit order, all of it settled."""
        published = {key: seqs for key, seqs in self.published.items() if seqs}
        committed = {key: seqs for key, seqs in self.committed.items() if seqs}
        assert published == committed, f"{self.where()} published != commit order"
        assert self.settled == {key: len(seqs) for key, seqs in published.items()}


def _step(record: OutboxRecord) -> Step:
    return Step.model_validate_json(record.value or b"{}")


# -- the relay, simulated -------------------------------------------------------------------------


@dataclass
class SimulatedRelay:
    """The worker's storage calls (relay/worker.py ``_cycle``, relay/settler.py), one step at a
    time so that writes can land anywhere: between cycles and between the ranks of one."""

    storage: OutboxStorage
    topic: str
    ledger: Ledger
    keep: bool = False
    ranks: list[list[OutboxRecord]] = field(default_factory=list)  #: claimed, not published
    unsettled: list[OutboxRecord] = field(default_factory=list)  #: the last rank published

    async def step(self) -> bool:
        """Settle the last rank and publish the next one of the claim, or (none left) claim,
        settling in the same call, and publish the first rank. False if the claim was empty."""
        if self.ranks:
            await self.storage.settle_and_claim((), 1, published=self.unsettled, keep=self.keep)
            self.ledger.settle(self.unsettled)
        else:
            records = await self.storage.settle_and_claim(
                [TopicPartition(self.topic, p) for p in range(PARTITIONS)],
                self.ledger.limit,
                published=self.unsettled,
                keep=self.keep,
                depth=self.ledger.depth,
            )
            self.ledger.settle(self.unsettled)
            self.unsettled = []
            self.ledger.claimed(records)
            self.ranks = by_depth(records)
            if not self.ranks:
                return False
        self.unsettled = self.ranks.pop(0)
        self.ledger.publish(self.unsettled)
        return True

    async def drain(self, within: float = 10.0) -> None:
        """Step until a claim finds nothing and every committed record is published (failing
        if claims find nothing for ``within`` seconds while some is not)."""
        deadline = time.monotonic() + within
        while True:
            if await self.step():
                deadline = time.monotonic() + within
                continue
            if self.ledger.all_published():
                return
            if time.monotonic() > deadline:
                missing = {
                    key: seqs[len(self.ledger.published.get(key, [])) :]
                    for key, seqs in self.ledger.committed.items()
                }
                raise AssertionError(f"{self.ledger.where()} never claimed: {missing}")
            await asyncio.sleep(0.005)  # an empty claim: a commit not yet visible to reads?

    async def check_drained(self) -> None:
        self.ledger.check_complete()
        left = [
            b
            for b in await self.storage.backlog()
            if b.topic == self.topic and b.pending + b.failed
        ]
        assert left == [], f"{self.ledger.where()} records left in the outbox: {left}"


# -- the writers ----------------------------------------------------------------------------------


@dataclass
class Held:
    """A transaction begun, with some events added, and held open in its own task."""

    keys: frozenset[str]
    task: asyncio.Task[None]
    finish: asyncio.Future[bool]  #: True: add the rest and end as drawn; False: roll back now


@dataclass
class Writers:
    tx: Transactions
    topic: str
    ledger: Ledger
    held: dict[int, Held] = field(default_factory=dict)

    async def write(self, calls: Sequence[Call], *, rollback: bool = False) -> None:
        events = self.ledger.events(self.topic, calls)
        with contextlib.suppress(RolledBack):
            async with self.tx.transaction() as t:
                await self._add(t, events)
                if rollback:
                    raise RolledBack
            self.ledger.commit(events)

    async def open(
        self, name: int, first: Sequence[Call], later: Sequence[Call], *, rollback: bool
    ) -> None:
        """Begin transaction ``name`` and add ``first``; :meth:`end` adds ``later`` and commits
        it (or rolls it back). No other transaction writes its keys meanwhile."""
        keys = frozenset(itertools.chain(*first, *later))
        assert not any(keys & h.keys for h in self.held.values()), "keys held by another"
        early, late = self.ledger.events(self.topic, first), self.ledger.events(self.topic, later)
        added = asyncio.Event()
        finish: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def hold() -> None:
            try:
                async with self.tx.transaction() as t:
                    await self._add(t, early)
                    added.set()
                    if not await finish:
                        raise RolledBack
                    await self._add(t, late)
                    if rollback:
                        raise RolledBack
                self.ledger.commit([*early, *late])
            finally:
                added.set()

        task = asyncio.create_task(hold())
        self.held[name] = Held(keys, task, finish)
        await added.wait()
        if task.done():
            await self.end(name)  # it failed before holding: raise its error

    async def end(self, name: int, *, abandon: bool = False) -> None:
        held = self.held.pop(name)
        if not held.finish.done():
            held.finish.set_result(not abandon)
        # Abandoned after a failure: that failure is the one to report, not this one's.
        with contextlib.suppress(RolledBack, *((Exception,) if abandon else ())):
            await held.task

    async def end_all(self, *, abandon: bool = False) -> None:
        for name in sorted(self.held):
            await self.end(name, abandon=abandon)

    async def _add(self, t: Any, events: Sequence[Sequence[Step]]) -> None:
        for call in events:
            if len(call) == 1:
                await self.tx.outbox.add(t, call[0])
            else:
                await self.tx.outbox.add_many(t, call)


@contextlib.asynccontextmanager
async def run(
    parts: Parts, depth: int, limit: int, *, keep: bool = False
) -> AsyncIterator[tuple[Writers, SimulatedRelay]]:
    """Writers and a simulated relay on a fresh topic; whatever transaction is still held at
    the end (only after a failure) is rolled back."""
    storage, tx = parts
    topic = f"order-{next(_runs)}"
    await storage.register_topics({topic: PARTITIONS})
    ledger = Ledger(depth, limit)
    writers = Writers(tx, topic, ledger)
    try:
        yield writers, SimulatedRelay(storage, topic, ledger, keep)
    finally:
        await writers.end_all(abandon=True)


# -- the scripted shapes --------------------------------------------------------------------------


def scripted_transactions() -> list[tuple[list[Call], bool]]:
    """Transactions of 1 to 12 events of a hot key (A, E or B: both partitions; up to 4 more
    than the deepest claim), another key after every second one; written as one ``add`` per
    event, one ``add_many``, or both mixed. The seventh rolls back."""
    a, b, c, d, e, f, g = KEYS
    others = [c, f, d, g]
    script: list[tuple[list[Call], bool]] = []
    for n in range(1, 13):
        hot = [a, e, b][n % 3]
        keys: list[str] = []
        for i in range(n):
            keys.append(hot)
            if i % 2:
                keys.append(others[(n + i) % len(others)])
        if n % 3 == 0:
            calls = [tuple(keys)]
        elif n % 3 == 1:
            calls = [(key,) for key in keys]
        else:
            half = len(keys) // 2
            calls = [tuple(keys[:half]), *((key,) for key in keys[half:])]
        script.append((calls, n == 7))
    return script


# -- any interleaving -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """A transaction that commits, or rolls back, at once."""

    calls: tuple[Call, ...]
    rollback: bool


@dataclass(frozen=True)
class Open:
    """A transaction begun now with ``first`` added, held open while others commit; ``later``
    is added when it ends (G3: begun early, committed late)."""

    name: int
    first: tuple[Call, ...]
    later: tuple[Call, ...]
    rollback: bool


@dataclass(frozen=True)
class End:
    name: int


@dataclass(frozen=True)
class RelaySteps:
    count: int


Op = Write | Open | End | RelaySteps


@dataclass(frozen=True)
class Program:
    depth: int
    limit: int
    keep: bool
    ops: tuple[Op, ...]


@st.composite
def transaction_calls(draw: st.DrawFn, free: Sequence[str]) -> tuple[Call, ...]:
    """1 to 10 events on 1 to 3 keys of ``free``, cut into writer calls at random."""
    keys = draw(st.lists(st.sampled_from(free), min_size=1, max_size=3, unique=True))
    events = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=10))
    cuts = draw(st.sets(st.integers(1, len(events) - 1))) if len(events) > 1 else set()
    bounds = [0, *sorted(cuts), len(events)]
    return tuple(tuple(events[i:j]) for i, j in itertools.pairwise(bounds))


@st.composite
def programs(draw: st.DrawFn) -> Program:
    ops: list[Op] = []
    held: dict[int, set[str]] = {}
    for name in range(draw(st.integers(1, 20))):
        free = [k for k in KEYS if not any(k in keys for keys in held.values())]
        kinds = ["write", "relay"]
        kinds += ["open"] if len(held) < MAX_HELD else []
        kinds += ["end"] if held else []
        kind = draw(st.sampled_from(kinds))
        if kind == "write":
            ops.append(Write(draw(transaction_calls(free)), draw(st.booleans())))
        elif kind == "relay":
            ops.append(RelaySteps(draw(st.integers(1, 4))))
        elif kind == "open":
            calls = draw(transaction_calls(free))
            split = draw(st.integers(0, len(calls)))
            ops.append(Open(name, calls[:split], calls[split:], draw(st.booleans())))
            held[name] = set(itertools.chain(*calls))
        else:
            ending = draw(st.sampled_from(sorted(held)))
            del held[ending]
            ops.append(End(ending))
    return Program(
        depth=draw(st.integers(1, 8)),
        limit=draw(st.sampled_from(BATCH_SIZES)),
        keep=draw(st.booleans()),
        ops=tuple(ops),
    )


def _default(name: str) -> int:
    """A relay setting's default (not the environment's value)."""
    return int(RelaySettings.model_fields[name].default)


@pytest.mark.asyncio
class RelayOrderContract:
    """Per-key order (G2) through the storage, as the relay drives it. Needs a
    ``relay_backend`` fixture: one fresh database of the backend per test."""

    @pytest_asyncio.fixture
    async def parts(self, relay_backend: RelayBackend) -> AsyncIterator[Parts]:
        async with (
            relay_backend.relay() as (storage, _),
            relay_backend.transactions(pool_size=MAX_HELD + 2) as tx,
        ):
            yield storage, tx

    @pytest.mark.parametrize("depth", DEPTHS, ids=[f"depth{d}" for d in DEPTHS])
    async def test_each_keys_commit_order_is_published_at_every_depth_and_batch_size(
        self, parts: Parts, depth: int
    ) -> None:
        """Keys with more events per transaction than the claim depth, interleaved within and
        across transactions; after the n-th transaction the relay takes n % 4 steps (claims and
        ranks), so that later transactions commit while it is mid-drain, even mid-cycle."""
        for limit in BATCH_SIZES:
            async with run(parts, depth, limit) as (writers, relay):
                for n, (calls, rollback) in enumerate(scripted_transactions(), start=1):
                    await writers.write(calls, rollback=rollback)
                    for _ in range(n % 4):
                        await relay.step()
                await relay.drain()
                await relay.check_drained()

    async def test_each_keys_commit_order_is_published_with_wide_ranks(self, parts: Parts) -> None:
        """The default batch size and depth (500, 4) over 300 keys with 5 events each: ranks of
        300 records, so that PostgreSQL settles them and claims in concurrent statements
        (``_SPLIT_AFTER``), each settling its own partitions' records before reading them."""
        keys = [f"w{i}" for i in range(300)]
        async with run(parts, _default("claim_depth"), _default("batch_size")) as (writers, relay):
            for r in range(5):
                shift = 37 * r % len(keys)
                await writers.write([(*keys[shift:], *keys[:shift])])
                for _ in range(2):
                    await relay.step()
            await relay.drain()
            await relay.check_drained()

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(program=programs())
    async def test_any_interleaving_of_writes_and_relay_steps_publishes_each_keys_commit_order(
        self, parts: Parts, program: Program
    ) -> None:
        """Random transactions (some rolled back, some held open while others commit and ended
        later), relay steps in between, any claim depth, batch size, with or without retention.
        Each example has its own topic; whatever is still held at the end commits (or rolls back,
        as drawn), then the relay drains the outbox."""
        async with run(parts, program.depth, program.limit, keep=program.keep) as (writers, relay):
            for op in program.ops:
                if isinstance(op, Write):
                    await writers.write(op.calls, rollback=op.rollback)
                elif isinstance(op, Open):
                    await writers.open(op.name, op.first, op.later, rollback=op.rollback)
                elif isinstance(op, End):
                    await writers.end(op.name)
                else:
                    for _ in range(op.count):
                        await relay.step()
            await writers.end_all()
            await relay.drain()
            await relay.check_drained()
