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

from outboxkit.relay.degraded import UNANNOUNCED_EPISODE, MissedWakeups
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
        self.missed = MissedWakeups(self.metrics.relay)
        self.gate = IdleGate(TPS, self.storage, self.metrics.relay, relay, self.stop, self.missed)

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


async def test_a_declaration_the_database_lost_is_made_again_at_the_sweep_and_reported() -> None:
    """PostgreSQL's unlogged ``relay_waiting`` is empty after a crash restart and on a promoted
    standby: the block still believes it waits, and writers wake nobody. Before, it never
    declared itself again (only after BUSY_AFTER busy cycles in a row, rare when quiet) and
    published on its sweep for good, saying nothing. Now each sweep declares it again; one the
    storage no longer had is reported once (a metric, the relay's episode) until a wake-up
    arrives."""
    rig = Rig(sweep_interval=0.05)
    await rig.idle()
    rig.take()
    rig.storage.declared.clear()  # the database restarted
    await asyncio.wait_for(rig.gate.rest(), 5)  # the sweep
    assert rig.storage.declared == set(TPS)  # writers wake it again
    assert rig.take() == set(TPS)
    assert rig.metrics.value("outboxkit_relay_declarations_lost_total") == len(TPS)
    assert rig.metrics.value("outboxkit_relay_wakeups_missed") == 1
    assert rig.missed.missed_for() is not None
    await asyncio.wait_for(rig.gate.rest(), 5)  # the next sweep: declared, nothing to report
    assert rig.metrics.value("outboxkit_relay_declarations_lost_total") == len(TPS)
    rig.gate.wake(tp(2))  # a writer's wake-up: the episode is over
    assert rig.missed.missed_for() is None
    assert rig.metrics.value("outboxkit_relay_wakeups_missed") == 0


async def test_a_reconnect_declares_the_block_again_before_it_waits() -> None:
    """After the listener reconnects (the database may have restarted or failed over), the
    block reads everything and declares itself again before its next wait, not a sweep
    later."""
    rig = Rig(sweep_interval=60.0)
    await rig.idle()
    rig.take()
    rig.storage.declared.clear()  # failed over: the new primary never had the declaration
    rig.gate.reconnected()
    assert rig.take() == set(TPS)
    await asyncio.wait_for(rig.gate.rest(), 5)  # no sweep to wait for: at once
    assert rig.storage.declared == set(TPS)
    assert rig.metrics.value("outboxkit_relay_declarations_lost_total") == len(TPS)
    assert rig.take() == set(TPS)  # and once more after the writers that missed it


async def test_a_declaration_that_cannot_be_made_again_is_tried_at_the_next_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(sweep_interval=60.0)
    await rig.idle()
    rig.take()
    rig.storage.declared.clear()
    declare = rig.storage.set_waiting

    async def unavailable(tps: object, waiting: bool) -> int:
        raise StorageUnavailableError("down (fake)")

    monkeypatch.setattr(rig.storage, "set_waiting", unavailable)
    rig.gate.reconnected()
    rig.take()
    await asyncio.wait_for(rig.gate.rest(), 5)
    assert rig.storage.declared == set()
    monkeypatch.setattr(rig.storage, "set_waiting", declare)
    rig.take()
    await asyncio.wait_for(rig.gate.rest(), 5)
    assert rig.storage.declared == set(TPS)


async def test_sweeps_that_keep_finding_unannounced_records_begin_an_episode() -> None:
    """Writers that do not wake the relay for any other reason (the listener cannot connect, a
    wake-up path broken): sweeps keep finding records. One such sweep is counted (a record
    committed as the sweep began has its wake-up on the way); UNANNOUNCED_EPISODE in a row
    begin an episode; a wake-up that names a partition ends it."""
    rig = Rig(sweep_interval=0.02)
    await rig.idle()
    rig.take()
    for sweep in range(1, UNANNOUNCED_EPISODE + 1):
        assert rig.missed.missed_for() is None
        await asyncio.wait_for(rig.gate.rest(), 5)
        rig.take()
        await rig.gate.after_cycle(True)
        assert rig.metrics.value(
            "outboxkit_relay_unannounced_sweeps_total", topic=TPS[0].topic
        ) == (sweep)
    assert rig.missed.missed_for() is not None
    rig.gate.wake(tp(0))
    assert rig.missed.missed_for() is None
    rig.take()
    await rig.gate.after_cycle(True)  # a cycle a wake-up started: announced
    assert rig.metrics.value("outboxkit_relay_unannounced_sweeps_total", topic=TPS[0].topic) == (
        UNANNOUNCED_EPISODE
    )
