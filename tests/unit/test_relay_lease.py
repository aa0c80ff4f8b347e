"""The producer lease (relay/lease.py) through its own interface, with the fake broker: a
producer starts only between two confirmations of the block's membership, after the other ids
that could carry its partitions are fenced; it is closed after an error and replaced.

These tests would catch a zombie initialising a producer (which could fence the rightful owner,
or publish beside it: G4), a producer kept although the group moved on during its init, a
failed start that leaves a producer open, or a fenced block that never publishes again."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from aiokafka.errors import KafkaConnectionError

from outboxkit.relay.blocks import fence_ids
from outboxkit.relay.clock import StageClock
from outboxkit.relay.lease import NotConfirmedError, ProducerLease
from outboxkit.relay.records import TopicPartition
from tests.helpers import wait_for
from tests.unit.relay_engine_harness import tp
from tests.unit.relay_fakes import FakeBroker
from tests.unit.relay_parts import BLOCK, TPS, Metrics, settings

LOG = structlog.get_logger("test")


class Rig:
    def __init__(self, *, transactional: bool = True) -> None:
        # A fenced lease asks the group again every heartbeat interval.
        self.settings = settings(transactional=transactional, heartbeat_interval=0.01)
        self.broker = FakeBroker()
        self.metrics = Metrics()
        self.stop = asyncio.Event()
        #: What the group answers, call by call (True once they run out).
        self.answers: list[bool | BaseException] = []
        self.confirmations: list[frozenset[TopicPartition]] = []
        clock = StageClock(self.metrics.relay, TPS, self.settings, self.stop)
        fencer = self.broker.fencer(self.settings)
        self.lease = ProducerLease(
            BLOCK, TPS, self.settings, self.confirm, fencer, self.broker.factory, clock
        )

    async def confirm(self, partitions: frozenset[TopicPartition]) -> bool:
        self.confirmations.append(partitions)
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_a_lease_confirms_fences_the_other_ids_starts_and_confirms_again() -> None:
    rig = Rig()
    publisher = await rig.lease.acquire(LOG)
    assert rig.lease.publisher is publisher
    assert rig.confirmations == [frozenset(TPS)] * 2
    group = rig.settings.group_id
    assert rig.broker.fenced_ids == sorted(fence_ids(group, TPS) - {BLOCK.transactional_id(group)})
    [started] = rig.broker.publishers
    assert started is publisher
    assert started.started
    assert not started.closed
    counts = {stage: rig.metrics.stage_count(stage) for stage in ("confirm", "fence", "init")}
    assert counts == {"confirm": 2, "fence": 1, "init": 1}


async def test_no_fence_and_no_producer_before_the_group_confirms() -> None:
    """A zombie (no longer a member of the current generation) must not initialise anything."""
    rig = Rig()
    rig.answers = [False]
    with pytest.raises(NotConfirmedError):
        await rig.lease.acquire(LOG)
    assert rig.broker.fenced_ids == []
    assert rig.broker.publishers == []
    assert rig.lease.publisher is None


async def test_a_producer_started_as_the_group_moved_on_is_closed_not_kept() -> None:
    """Confirmed before the init, not after: another relay may have the partitions now."""
    rig = Rig()
    rig.answers = [True, False]
    with pytest.raises(NotConfirmedError):
        await rig.lease.acquire(LOG)
    [publisher] = rig.broker.publishers
    assert publisher.started
    assert publisher.closed
    assert rig.lease.publisher is None


async def test_a_failed_start_closes_the_producer_and_the_next_attempt_starts_afresh() -> None:
    rig = Rig()
    rig.broker.start_failures[tp(0)].append(KafkaConnectionError("no broker (fake)"))
    with pytest.raises(KafkaConnectionError):
        await rig.lease.acquire(LOG)
    [failed] = rig.broker.publishers
    assert failed.closed
    assert rig.lease.publisher is None
    publisher = await rig.lease.acquire(LOG)
    assert publisher is not failed
    assert publisher.started


async def test_a_held_lease_is_reused_and_a_dropped_one_replaced() -> None:
    rig = Rig()
    first = await rig.lease.acquire(LOG)
    assert await rig.lease.acquire(LOG) is first
    assert len(rig.confirmations) == 2  # not asked again while held
    await rig.lease.drop()
    assert rig.broker.publishers[0].closed
    assert rig.lease.publisher is None
    second = await rig.lease.acquire(LOG)
    assert second is not first
    assert len(rig.confirmations) == 4
    await rig.lease.drop()
    await rig.lease.drop()  # nothing held: nothing to do


async def test_without_transactions_nothing_is_confirmed_or_fenced() -> None:
    rig = Rig(transactional=False)
    await rig.lease.acquire(LOG)
    assert rig.confirmations == []
    assert rig.broker.fenced_ids == []


async def test_a_fenced_lease_is_regained_once_the_group_confirms() -> None:
    """Retriable errors while asking do not end the wait; the group's confirmation does."""
    rig = Rig()
    rig.answers = [False, KafkaConnectionError("coordinator moving (fake)"), False, True]
    assert await asyncio.wait_for(rig.lease.regain(rig.stop), 5)
    assert len(rig.confirmations) == 4


async def test_a_fenced_lease_stops_waiting_when_the_block_stops() -> None:
    rig = Rig()
    rig.answers = [False] * 10_000
    waiting = asyncio.create_task(rig.lease.regain(rig.stop))
    await wait_for(lambda: len(rig.confirmations) >= 2, what="the group asked again")
    rig.stop.set()
    assert not await asyncio.wait_for(waiting, 5)
