"""The idle/busy gate (relay/gate.py) through its own interface, on the in-memory outbox: which
partitions a block reads, when it declares itself waiting, and how it waits.

Wake-ups are hints (G5 makes them fast, G1 must not depend on them): these tests would catch a
gate that reads only the partitions that woke it while it is busy, that misses a writer who
committed as the block declared itself idle, that waits past the sweep, or that leaves writers
notifying a block that reads everything anyway."""

from __future__ import annotations

import asyncio
import time

import pytest

from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.gate import BUSY_AFTER, IDLE_AFTER, IdleGate
from outboxkit.relay.records import TopicPartition
from tests.unit.relay_engine_harness import tp
from tests.unit.relay_fakes import SpyStorage
from tests.unit.relay_parts import TPS, Metrics, settings


class Rig:
    def __init__(self, *, sweep_interval: float = 60.0) -> None:
        self.storage = SpyStorage()
        self.metrics = Metrics()
        self.stop = asyncio.Event()
        relay = settings(sweep_interval=sweep_interval)
        self.gate = IdleGate(TPS, self.storage, self.metrics.relay, relay, self.stop)

    def take(self) -> set[TopicPartition]:
        look, _ = self.gate.take()
        return look

    async def idle(self) -> None:
        """Take what is due, then declare the block idle."""
        self.take()
        await self.gate.rest()
        assert self.gate.waiting


async def test_a_gate_reads_everything_first_and_again_once_declared_idle() -> None:
    """After declaring itself waiting, a block reads every partition once more: a writer that
    committed before the declaration was visible sent no wake-up."""
    rig = Rig()
    assert rig.gate.due
    assert rig.take() == set(TPS)
    assert not rig.gate.due
    await rig.gate.rest()
    assert rig.gate.waiting
    assert rig.storage.declared == set(TPS)  # writers now wake it
    assert rig.take() == set(TPS)


async def test_an_idle_gate_reads_what_woke_it_and_says_when() -> None:
    rig = Rig()
    await rig.idle()
    rig.take()
    assert not rig.gate.due
    before = time.perf_counter()
    rig.gate.wake(tp(1))
    assert rig.gate.due
    look, woken_at = rig.gate.take()
    assert look == {tp(1)}
    assert woken_at is not None
    assert woken_at >= before
    rig.gate.wake(None)  # a reconnect: maybe any partition
    assert rig.take() == set(TPS)


@pytest.mark.parametrize("by", ["wake-up", "interrupt"])
async def test_a_wake_up_or_an_interrupt_ends_the_wait_at_once(by: str) -> None:
    rig = Rig(sweep_interval=60.0)
    await rig.idle()
    rig.take()
    waiting = asyncio.create_task(rig.gate.rest())
    await asyncio.sleep(0)
    if by == "wake-up":
        rig.gate.wake(tp(0))
    else:
        rig.gate.interrupt()  # the worker stops
    await asyncio.wait_for(waiting, 5)
    assert rig.metrics.value("outboxkit_relay_wakeups_total", reason="notify") == 1
    assert rig.take() == ({tp(0)} if by == "wake-up" else set())


async def test_an_idle_gate_sweeps_every_partition_when_no_wake_up_comes() -> None:
    """Catches a lost notification that would leave a record unpublished (G1): the sweep reads
    every partition after ``sweep_interval``."""
    rig = Rig(sweep_interval=0.05)
    await rig.idle()
    rig.take()
    await asyncio.wait_for(rig.gate.rest(), 5)
    assert rig.metrics.value("outboxkit_relay_wakeups_total", reason="sweep") == 1
    assert rig.take() == set(TPS)


async def test_a_block_turns_busy_after_cycles_that_found_records_and_idle_after_empty_ones() -> (
    None
):
    """Busy: writers notify nobody and the block reads every partition each cycle; it polls
    again after an empty cycle until IDLE_AFTER of them, then declares itself idle again."""
    rig = Rig()
    await rig.idle()
    for _ in range(BUSY_AFTER - 1):
        await rig.gate.after_cycle(True)
    await rig.gate.after_cycle(False)  # an empty cycle starts the streak again
    for _ in range(BUSY_AFTER - 1):
        await rig.gate.after_cycle(True)
    assert rig.gate.waiting
    await rig.gate.after_cycle(True)
    assert not rig.gate.waiting
    assert rig.storage.declared == set()  # writers wake nobody
    rig.take()
    rig.gate.look_again([tp(0)])
    assert rig.take() == set(TPS)  # busy: every partition, whatever is due
    for _ in range(IDLE_AFTER - 1):
        await rig.gate.after_cycle(False)
        assert rig.gate.due  # poll again
        rig.take()
    await rig.gate.after_cycle(True)  # a cycle that found records starts the count again
    for _ in range(IDLE_AFTER - 1):
        await rig.gate.after_cycle(False)
        rig.take()
    await rig.gate.after_cycle(False)
    assert not rig.gate.due
    await rig.gate.rest()
    assert rig.gate.waiting
    assert rig.storage.declared == set(TPS)


async def test_a_gate_that_cannot_declare_itself_idle_stays_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The database unreachable: no wake-ups can come, so the block must not believe it waits
    for them; it reads every partition again."""
    rig = Rig()

    async def unavailable(tps: object, waiting: bool) -> None:
        raise StorageUnavailableError("down (fake)")

    monkeypatch.setattr(rig.storage, "set_waiting", unavailable)
    rig.take()
    await rig.gate.rest()
    assert not rig.gate.waiting
    assert rig.take() == set(TPS)


async def test_leaving_stops_writers_waking_the_block() -> None:
    rig = Rig()
    await rig.idle()
    await rig.gate.leave()
    assert not rig.gate.waiting
    assert rig.storage.declared == set()
