"""The stage clock (relay/clock.py) through its own interface: each stage observed into
``outboxkit_relay_stage_seconds``, the stage running now for the relay's watch, slow stages
logged (waits by design never), and the pace of cycles.

These tests would catch a publish that failed mid-send and went unmeasured (the slow-stage log
and the histogram are how an operator sees a broker hold sends up), a stage left "running" after
it ended (the watch would warn forever), and a pace that made a backlog wait ``batch_interval``
between cycles or a stopping worker wait it out."""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog

from outboxkit.relay.clock import StageClock
from tests.unit.relay_parts import TPS, Metrics, settings


class Rig:
    def __init__(self, *, slow_after: float = 60.0, batch_interval: float = 0.0) -> None:
        self.metrics = Metrics()
        self.stop = asyncio.Event()
        relay = settings(slow_after=slow_after, batch_interval=batch_interval)
        self.clock = StageClock(self.metrics.relay, TPS, relay, self.stop)


def test_a_stage_is_current_while_it_runs_then_observed() -> None:
    rig = Rig()
    assert rig.clock.current is None
    before = time.monotonic()
    with rig.clock.stage("claim"):
        assert rig.clock.current == "claim"
        assert rig.clock.since >= before
    assert rig.clock.current is None
    assert rig.metrics.stage_count("claim") == 1


def test_a_stage_that_fails_is_observed_too() -> None:
    rig = Rig()
    with pytest.raises(RuntimeError), rig.clock.stage("settle"):
        raise RuntimeError("the database went away (fake)")
    assert rig.clock.current is None
    assert rig.metrics.stage_count("settle") == 1


def test_a_publish_is_timed_by_the_stages_its_publisher_reports() -> None:
    rig = Rig()
    with rig.clock.publishing() as times:
        assert rig.clock.current == "send"
        times.send = 0.25
        times.enter("commit")
        assert rig.clock.current == "commit"
        times.commit = 0.5
    assert rig.clock.current is None
    assert rig.metrics.value("outboxkit_relay_stage_seconds_sum", stage="send") == 0.25
    assert rig.metrics.value("outboxkit_relay_stage_seconds_sum", stage="commit") == 0.5


def test_a_publish_that_fails_while_sending_counts_until_it_failed() -> None:
    rig = Rig()
    with pytest.raises(TimeoutError), rig.clock.publishing():
        _sleep_then_time_out(0.02)
    assert rig.metrics.value("outboxkit_relay_stage_seconds_sum", stage="send") >= 0.02
    assert rig.metrics.stage_count("commit") == 0


def _sleep_then_time_out(seconds: float) -> None:
    time.sleep(seconds)
    raise TimeoutError


def test_slow_stages_are_logged_and_waits_never() -> None:
    rig = Rig(slow_after=1.0)
    with structlog.testing.capture_logs() as logs:
        rig.clock.record("send", 2.0)
        rig.clock.record("pace", 2.0)
        rig.clock.record("wakeup", 2.0)
        rig.clock.record("claim", 0.5)
    slow = [e for e in logs if e["event"] == "slow relay stage"]
    assert [(e["stage"], e["partitions"]) for e in slow] == [("send", ["t/0", "t/1"])]


def test_a_wake_up_is_timed_until_the_cycle_it_led_to() -> None:
    rig = Rig()
    rig.clock.begin_cycle(time.perf_counter() - 0.5)
    assert rig.metrics.value("outboxkit_relay_stage_seconds_sum", stage="wakeup") >= 0.5
    rig.clock.begin_cycle(None)
    assert rig.metrics.stage_count("wakeup") == 1


async def test_cycles_are_paced_by_the_batch_interval_unless_a_backlog_waits() -> None:
    rig = Rig(batch_interval=0.3)
    rig.clock.begin_cycle(None)
    began = time.monotonic()
    await rig.clock.pace(backlog=True)
    assert time.monotonic() - began < 0.2  # a backlog goes on at once
    await asyncio.wait_for(rig.clock.pace(backlog=False), 5)
    assert time.monotonic() - began >= 0.25
    assert rig.metrics.stage_count("pace") == 1


async def test_a_stopping_worker_does_not_wait_for_the_pace() -> None:
    rig = Rig(batch_interval=1.0)
    rig.clock.begin_cycle(None)
    pacing = asyncio.create_task(rig.clock.pace(backlog=False))
    await asyncio.sleep(0)
    assert rig.clock.current == "pace"
    rig.stop.set()
    await asyncio.wait_for(pacing, 5)
    # Ended by the stop, not by the interval (half of it is a generous bound on a busy machine).
    assert rig.metrics.value("outboxkit_relay_stage_seconds_sum", stage="pace") < 0.5
