"""The partition reconciler alone (relay/reconciler.py), with workers that only run and stop.

Through its own interface (assign, revoke, halt, close; owned, workers, worker_of, crashed): one
worker per block of the owned partitions, a block that leaves the plan drained before the blocks
that replace it start (G4 within one relay), a drain bounded by ``revoke_timeout``, and a worker
that fails restarted with a growing backoff while the others go on (G8). The whole relay with
real block workers is driven in test_relay_engine*.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from prometheus_client import CollectorRegistry

from outboxkit.relay.blocks import Block
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.reconciler import CrashBackoff, PartitionReconciler
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.worker import BlockWorker
from tests.helpers import holds_for
from tests.unit.relay_engine_harness import TOPIC, tp, until


@dataclass
class Worker:
    """What the reconciler asks of a block worker: run until asked to stop."""

    block: Block
    tps: list[TopicPartition]
    fail: BaseException | None = None
    deaf: bool = False  # ignores request_stop, like a batch stuck on the network
    task: asyncio.Task[None] | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def request_stop(self) -> None:
        self.stopping.set()

    async def run(self) -> None:
        if self.fail is not None:
            raise self.fail
        await (asyncio.Event() if self.deaf else self.stopping).wait()


class Rig:
    """A reconciler of topic ``t`` (``partitions`` partitions) and the workers it made."""

    def __init__(
        self, partitions: int = 4, backoff: CrashBackoff | None = None, **settings: Any
    ) -> None:
        values = {"database_url": "postgresql://x/y", "topics": TOPIC, **settings}
        self.registry = CollectorRegistry()
        self.errors: list[BaseException] = []
        self.made: list[Worker] = []
        #: Per worker made, the partitions other workers were still running at that moment.
        self.overlaps: list[set[TopicPartition]] = []
        self.fail_next: list[BaseException] = []
        self.deaf = False
        self.partitions = PartitionReconciler(
            RelaySettings(**values),
            RelayMetrics(self.registry),
            self.new_worker,
            self.errors.append,
            backoff,
        )
        self.partitions.counts[TOPIC] = partitions

    def new_worker(self, block: Block, tps: list[TopicPartition]) -> BlockWorker:
        running = {p for w in self.made if w.alive for p in w.tps}
        self.overlaps.append(running & set(tps))
        fail = self.fail_next.pop(0) if self.fail_next else None
        worker = Worker(block, tps, fail=fail, deaf=self.deaf)
        self.made.append(worker)
        return cast(BlockWorker, worker)

    def blocks(self) -> list[str]:
        return sorted(str(w.block) for w in self.partitions.workers)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def tps(*partitions: int) -> frozenset[TopicPartition]:
    return frozenset(tp(p) for p in partitions)


async def test_one_worker_per_block_and_a_leaving_block_ends_before_its_successors_start() -> None:
    """G4 within one relay: would catch a reconciler that starts the blocks replacing a
    revoked one before the old block's worker ended (two producers on one partition)."""
    rig = Rig(partitions=4, partitions_per_transaction=4)
    await rig.partitions.assign(tps(0, 1, 2, 3))
    assert rig.blocks() == ["t/0-3"]
    await rig.partitions.revoke(tps(3))
    assert rig.blocks() == ["t/0-1", "t/2"]
    old = rig.made[0]
    assert old.stopping.is_set()
    assert old.task is not None
    assert old.task.done()
    assert rig.overlaps == [set(), set(), set()], "a block started beside a running one"
    assert rig.partitions.owned == tps(0, 1, 2)
    assert rig.partitions.worker_of(tp(2)) is cast(BlockWorker, rig.made[2])
    assert rig.partitions.worker_of(tp(3)) is None
    assert rig.metric("outboxkit_relay_owned_partitions") == 3
    await rig.partitions.close()
    assert (rig.partitions.owned, rig.partitions.workers) == (frozenset(), [])
    assert not any(w.alive for w in rig.made)


async def test_a_worker_that_does_not_drain_is_abandoned_after_the_revoke_timeout() -> None:
    """Would catch a revocation that waits for ever on a stuck batch (the group's rebalance
    would wait with it)."""
    rig = Rig(partitions=1, revoke_timeout=0.1)
    rig.deaf = True
    await rig.partitions.assign(tps(0))
    [stuck] = rig.made
    await asyncio.wait_for(rig.partitions.revoke(tps(0)), 3)
    assert stuck.task is not None
    assert stuck.task.cancelled()
    assert rig.partitions.workers == []


async def test_a_failed_worker_is_shown_restarted_with_backoff_and_the_others_go_on() -> None:
    """G8: would catch a failed block that stops the others, is not shown as crashed, or is
    never restarted."""
    rig = Rig(partitions=2, partitions_per_transaction=1, backoff=CrashBackoff(first=0.3))
    await rig.partitions.assign(tps(1))
    rig.fail_next = [RuntimeError("a bug"), RuntimeError("the same bug")]
    await rig.partitions.assign(tps(0))
    await until(lambda: len(rig.errors) == 1, "the failure reported")
    assert rig.partitions.crashed == {tp(0)}
    assert rig.made[0].alive, "the other block goes on"
    assert rig.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="crashed") == 1
    await until(lambda: len(rig.errors) == 2, "restarted, and failed again")
    await until(lambda: len(rig.made) == 4, "restarted again, after a longer wait", within=5)
    assert rig.made[3].block == rig.made[1].block
    await until(lambda: rig.made[3].alive, "the third start runs")
    assert rig.partitions.crashed == set()
    await rig.partitions.close()


async def test_a_halted_reconciler_starts_no_worker() -> None:
    """Would catch a restart scheduled while the relay stops, or a worker started for an
    assignment that completes while the stopping relay leaves its group: both outlived the
    relay (a Ctrl-C during the relay's join logged "relay stopped", then "partitions assigned"
    and a block retrying against the closed pool)."""
    rig = Rig(partitions=2, partitions_per_transaction=1)
    rig.fail_next = [RuntimeError("a bug")]
    await rig.partitions.assign(tps(0))  # its worker fails as soon as it runs: after the halt
    rig.partitions.halt()
    await rig.partitions.close()
    await rig.partitions.assign(tps(1))  # a late assignment

    async def nothing_restarted() -> None:
        assert rig.errors == []
        assert rig.partitions.crashed == set()

    await holds_for(0.05, nothing_restarted, interval=0.01)
    assert len(rig.made) == 1
    assert rig.partitions.workers == []


def test_the_backoff_doubles_to_its_cap_and_forgets_after_a_quiet_while() -> None:
    backoff = CrashBackoff()
    block = Block(TOPIC, 0, 0)
    delays = [backoff.failed(block, float(t))[1] for t in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff.failed(Block(TOPIC, 1, 0), 9.0) == (1, 0.5), "per block"
    assert backoff.failed(block, 8.0 + 301.0) == (1, 0.5)
