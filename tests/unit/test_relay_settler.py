"""The settler (relay/settler.py) through its own interface, on the in-memory outbox: what Kafka
accepted is settled by the next storage call, and stays to settle again if that call fails;
what Kafka refused is recorded, and parked after ``max_attempts``.

These tests would catch a settle lost with a failed call (the batch would stay pending and go
out again after its keys' newer records: ``R0 R1 R2 R1``, against G2), a record settled that
Kafka never accepted (lost: G1), and a record Kafka keeps refusing retried forever or parked
before its attempts ran out (G8)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import structlog

from outboxkit.relay.clock import StageClock
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.settler import Settler
from tests.unit.relay_engine_harness import TOPIC, Ping, keys_on, tp
from tests.unit.relay_fakes import REJECTION, SpyStorage
from tests.unit.relay_parts import TPS, Metrics, settings

LOG = structlog.get_logger("test")


class Rig:
    def __init__(self, **overrides: object) -> None:
        self.storage = SpyStorage()
        self.metrics = Metrics()
        relay = settings(max_attempts=2, claim_depth=1, **overrides)
        clock = StageClock(self.metrics.relay, TPS, relay, asyncio.Event())
        self.settler = Settler(self.storage, relay, self.metrics.relay, clock)

    async def open(self) -> Rig:
        await self.storage.register_topics({TOPIC: 2})
        return self

    def add(self, key: int, n: int = 0) -> None:
        self.storage.add(Ping(key=keys_on(0, 2)[key], n=n))


async def test_what_kafka_accepted_is_settled_by_the_next_claim() -> None:
    rig = await Rig().open()
    rig.add(0, 0)
    rig.add(0, 1)
    [first] = await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    rig.settler.accepted([first])
    assert rig.settler.unsettled == 1
    [second] = await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    assert rig.settler.unsettled == 0
    assert rig.storage.state_of(first) is None  # deleted
    assert rig.storage.state_of(second) == "pending"
    assert rig.metrics.stage_count("claim") == 2


@pytest.mark.parametrize("settled_anyway", [False, True], ids=["lost", "answer-lost"])
async def test_a_failed_claim_keeps_what_kafka_accepted_to_settle_again(
    settled_anyway: bool,
) -> None:
    """Whether the failed call settled or not, the records stay until a call succeeds."""
    rig = await Rig().open()
    rig.add(0)
    [record] = await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    rig.settler.accepted([record])
    if settled_anyway:
        rig.storage.fail_calls.add(3)  # an odd call settles, then fails
        rig.storage.calls += 1
    else:
        rig.storage.fetch_errors.append(StorageUnavailableError("down (fake)"))
    with pytest.raises(StorageUnavailableError):
        await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    assert rig.settler.unsettled == 1
    assert rig.storage.state_of(record) == (None if settled_anyway else "pending")
    assert await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20) == []
    assert rig.settler.unsettled == 0
    assert rig.storage.state_of(record) is None


async def test_settling_alone_with_retention_marks_published() -> None:
    rig = await Rig(retention=timedelta(hours=1)).open()
    rig.add(0)
    [record] = await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    rig.settler.accepted([record])
    rig.storage.fetch_errors.append(StorageUnavailableError("down (fake)"))
    with pytest.raises(StorageUnavailableError):
        await rig.settler.settle()
    assert rig.settler.unsettled == 1
    await rig.settler.settle()
    assert rig.settler.unsettled == 0
    assert rig.storage.state_of(record) == "published"
    assert rig.metrics.stage_count("settle") == 2


async def test_a_refused_record_is_retried_then_parked_after_max_attempts() -> None:
    rig = await Rig().open()
    rig.add(0)
    [record] = await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    assert not await rig.settler.refused([(record, REJECTION)], LOG)
    assert rig.storage.state_of(record) == "pending"
    [again] = await rig.settler.settle_and_claim(TPS, 10, max_bytes=1 << 20)
    assert again.attempts == 1
    assert await rig.settler.refused([(again, REJECTION)], LOG)
    assert rig.storage.state_of(record) == "failed"
    rejected = {"topic": TOPIC, "kind": "rejected"}
    assert rig.metrics.value("outboxkit_relay_publish_errors_total", **rejected) == 2
    assert rig.metrics.value("outboxkit_relay_parked_total", topic=TOPIC) == 1
    assert await rig.settler.settle_and_claim([tp(0)], 10, max_bytes=1 << 20) == []  # held back
