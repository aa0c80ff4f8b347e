"""The relay's side tasks and their supervision, each through its own small interface, on the
in-memory outbox (core/supervisor.py, relay/side_tasks.py, relay/departed.py).

A side task that ends stops the relay; stopping never waits on one for ever; wake-ups reach the
worker of their partition; the backlog and what is stalled; the watch's rate limits; the purge
in batches (G7); the check for departed relays announces, evicts, and never raises; a relay that
cannot read its database steps out of its group and back. The whole
relay runs them in test_relay_engine_ownership.py and test_relay_blocks.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import structlog
from aiokafka.errors import NodeNotReadyError
from prometheus_client import CollectorRegistry

from outboxkit.core.step_aside import StepAside
from outboxkit.core.supervisor import Supervisor
from outboxkit.core.waiting import unless_stopped
from outboxkit.relay.blocks import Block
from outboxkit.relay.departed import DepartedCheck
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.side_tasks import (
    BacklogMonitor,
    StageWatch,
    clean_up,
    dispatch_wakeups,
)
from outboxkit.relay.storage import OutboxStorage
from outboxkit.relay.worker import BlockWorker
from tests.helpers import LosesOneCancellation, holds_for
from tests.unit.relay_engine_harness import TOPIC, Ping, keys_on, tp, until
from tests.unit.relay_fakes import ManualOwnership, SpyStorage


def settings(**values: Any) -> RelaySettings:
    return RelaySettings(**{"database_url": "postgresql://x/y", "topics": TOPIC, **values})


def metrics() -> tuple[RelayMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return RelayMetrics(registry), registry


# -- supervision -------------------------------------------------------------------------------


async def test_a_side_task_that_ends_stops_the_relay_with_its_name_or_error() -> None:
    """Would catch a relay that keeps running half-blind after a side task ended."""
    tasks = Supervisor("relay")
    tasks.start("forever", asyncio.Event().wait())  # type: ignore[arg-type]
    tasks.start("quitter", asyncio.sleep(0))  # ends at once
    with pytest.raises(RuntimeError, match="relay task quitter ended unexpectedly"):
        await asyncio.wait_for(tasks.wait(asyncio.Event()), 2)

    async def broken() -> None:
        raise ValueError("wakeups lost")

    failing = Supervisor("relay")
    failing.start("wakeups", broken())
    with pytest.raises(ValueError, match="wakeups lost"):
        await asyncio.wait_for(failing.wait(asyncio.Event()), 2)
    await tasks.cancel()
    await failing.cancel()
    assert all(t.done() for t in tasks._tasks)


async def test_stopping_returns_and_cancel_ends_every_side_task() -> None:
    stopping = asyncio.Event()
    tasks = Supervisor("relay")
    tasks.start("forever", asyncio.Event().wait())  # type: ignore[arg-type]
    waiting = asyncio.create_task(tasks.wait(stopping))

    async def still_waiting() -> None:
        assert not waiting.done()

    await holds_for(0.01, still_waiting, interval=0.002)
    stopping.set()
    await asyncio.wait_for(waiting, 2)
    await asyncio.wait_for(tasks.cancel(), 2)
    assert [t.cancelled() for t in tasks._tasks] == [True]


class _LosesCancellation(SpyStorage):
    """An outbox whose calls lose the first cancellation (:class:`LosesOneCancellation`)."""

    def __init__(self) -> None:
        super().__init__()
        self.loses = LosesOneCancellation()

    async def backlog(self) -> list[PartitionBacklog]:
        await self.loses()
        return await super().backlog()

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        await self.loses()
        return 0

    async def announce_member(self, group: str, member_id: str) -> None:
        await self.loses()
        await super().announce_member(group, member_id)


@pytest.mark.parametrize("side_task", ["backlog", "purge", "departed check"])
async def test_a_side_task_ends_when_its_database_call_lost_the_cancellation(
    side_task: str,
) -> None:
    """Would catch a side task that polls on after its cancellation was lost in a driver call
    (the MongoDB change stream's did, 4 runs in 5: the contract's G5 wake-up test): a stopping
    relay would wait out its 5 s grace, log an error, and leave the task running."""
    storage = _LosesCancellation()
    configured = settings(retention=60.0, metrics_interval=0.01, cleanup_interval=0.01)
    m = metrics()[0]
    work = {
        "backlog": lambda: BacklogMonitor(storage, configured, m).run(),
        "purge": lambda: clean_up(storage, configured),
        "departed check": lambda: DepartedCheck(
            configured, storage, ManualOwnership({TOPIC: 1}), m
        ).run(),
    }[side_task]()
    await storage.loses.assert_ends_when_cancelled(work)


async def test_work_unless_stopped_ends_raises_or_is_cancelled() -> None:
    """Would catch a relay that cannot stop while the database is away at start, or that
    swallows the error of a registration that failed for good."""
    stopping = asyncio.Event()
    assert await unless_stopped(stopping, asyncio.sleep(0))

    async def refused() -> None:
        raise RuntimeError("permission denied")

    with pytest.raises(RuntimeError, match="permission denied"):
        await unless_stopped(stopping, refused())
    cancelled, started = asyncio.Event(), asyncio.Event()

    async def retrying() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    waiting = asyncio.create_task(unless_stopped(stopping, retrying()))
    await until(started.is_set, "the retrying coroutine started")
    stopping.set()
    assert await asyncio.wait_for(waiting, 2) is False
    assert cancelled.is_set()


# -- wake-ups, backlog, the watch, the purge ----------------------------------------------------


@dataclass
class Worker:
    """What the side tasks read of a block worker."""

    block: Block
    tps: list[TopicPartition]
    woken: list[TopicPartition | None] = field(default_factory=list)
    stage: str | None = None
    stage_since: float = 0.0
    failing_since: float | None = None
    last_success: float | None = None
    last_error: str | None = None

    def wake(self, tp: TopicPartition | None) -> None:
        self.woken.append(tp)

    def reconnected(self) -> None:
        self.woken.append(None)


class Blocks:
    def __init__(self, *workers: Worker) -> None:
        self._workers = list(workers)

    @property
    def workers(self) -> list[BlockWorker]:
        return cast(list[BlockWorker], self._workers)

    def worker_of(self, tp: TopicPartition) -> BlockWorker | None:
        return next((cast(BlockWorker, w) for w in self._workers if tp in w.tps), None)


async def test_a_wakeup_reaches_the_worker_of_its_partition_and_a_reconnect_every_worker() -> None:
    """G5: would catch a commit's wake-up lost, or a reconnect that leaves a worker asleep
    (each worker is told it reconnected: it reads everything and declares itself again)."""
    storage = SpyStorage()
    await storage.register_topics({TOPIC: 4})
    low, high = Worker(Block(TOPIC, 0, 1), [tp(0), tp(1)]), Worker(Block(TOPIC, 2, 0), [tp(2)])
    m, registry = metrics()
    task = asyncio.create_task(dispatch_wakeups(storage, Blocks(low, high), m))
    try:
        await storage.set_waiting([tp(1), tp(3)], True)
        storage.add(Ping(key=keys_on(1, 4)[0]))
        storage.add(Ping(key=keys_on(3, 4)[0]))  # nobody's: dropped
        storage.signal_reconnect()
        await until(lambda: len(high.woken) == 1, "the reconnect")
        assert (low.woken, high.woken) == ([tp(1), None], [None])
        assert registry.get_sample_value("outboxkit_relay_wakeups_total", {"reason": "reconnect"})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_backlog_counts_pending_per_partition_and_names_the_stalled() -> None:
    storage = SpyStorage()
    await storage.register_topics({TOPIC: 2})
    monitor = BacklogMonitor(storage, settings(stall_after=0.05), metrics()[0])
    assert monitor.backlog is None  # not measured yet: the health shows no counts
    storage.add(Ping(key=keys_on(1, 2)[0]))
    await monitor.measure()
    assert monitor.backlog is not None
    assert monitor.backlog[tp(1)].pending == 1
    assert monitor.pending({tp(0), tp(1)}) == 1
    assert monitor.stalled == set()

    async def stalled() -> bool:
        await monitor.measure()
        return monitor.stalled == {tp(1)}

    await until(stalled, "stalled once stall_after has passed")
    assert monitor.stalled == {tp(1)}


class _Backlogs(SpyStorage):
    """``outcomes``: how the next backlog reads go (``down``: unavailable; ``hang``: never
    answers, as on a half-open link or a pool that never frees a connection); then they work."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: deque[str] = deque()

    async def backlog(self) -> list[PartitionBacklog]:
        outcome = self.outcomes.popleft() if self.outcomes else "ok"
        if outcome == "down":
            raise StorageUnavailableError("PostgreSQL is unavailable (fake)")
        if outcome == "hang":
            await asyncio.Event().wait()
        return await super().backlog()


async def test_the_health_backlog_is_never_a_stale_measure() -> None:
    """#44 item 17: /healthz kept showing a backlog long published (`relay status`: 0). A measure
    that never answered held the monitor for good, and one that failed left the last counts
    shown as current, silently. Now a measure is cut after the interval (or connect_timeout),
    a failed one forgets its counts (pending: null) with one warning per streak, and the next
    measure that works shows the truth."""
    storage = _Backlogs()
    await storage.register_topics({TOPIC: 2})
    for key in keys_on(1, 2)[:3]:
        storage.add(Ping(key=key))
    monitor = BacklogMonitor(
        storage, settings(metrics_interval=0.05, connect_timeout=0.05), metrics()[0]
    )
    task = asyncio.create_task(monitor.run())
    try:
        await until(lambda: monitor.pending({tp(1)}) == 3, "the backlog measured")
        with structlog.testing.capture_logs() as logs:
            storage.outcomes.extend(["hang", "down"])
            storage.table.rows.clear()  # published meanwhile
            await until(lambda: monitor.backlog is None, "the hung measure given up")
            await until(lambda: not storage.outcomes, "the failing measures done")
            await until(lambda: monitor.backlog == {}, "the truth once a measure works")
        warnings = [e for e in logs if e["event"] == "cannot measure the backlog"]
        assert len(warnings) == 1, logs
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Measured:
    """A storage whose backlog is ``rows``, as given."""

    def __init__(self, rows: list[PartitionBacklog]) -> None:
        self.rows = rows

    async def backlog(self) -> list[PartitionBacklog]:
        return self.rows


async def test_a_partition_is_stalled_by_the_databases_clock_not_the_relays() -> None:
    """#41: a relay whose clock ran 45 s fast reported a partition stalled 45 s early (its now
    minus the record's created_at, written on the database's clock). The database now measures
    the age itself; only a storage that does not falls back to the relay's clock."""
    written = datetime.now(UTC) - timedelta(seconds=45)  # as a relay 45 s fast sees it
    rows = [
        PartitionBacklog(TOPIC, 0, 1, written, oldest_age=2.0),  # 2 s old by the database
        PartitionBacklog(TOPIC, 1, 1, written),  # no age given: the relay's clock
    ]
    registry = CollectorRegistry()
    monitor = BacklogMonitor(
        cast(OutboxStorage, _Measured(rows)), settings(stall_after=30), RelayMetrics(registry)
    )
    await monitor.measure()
    assert monitor.stalled == {tp(1)}
    age = registry.get_sample_value(
        "outboxkit_relay_oldest_pending_age_seconds", {"topic": TOPIC, "partition": "0"}
    )
    assert age == 2.0


async def test_a_database_unreadable_for_stall_after_makes_the_relay_unhealthy() -> None:
    """#41: a relay whose database stops answering (a half-open link) kept /healthz 200 while
    its partitions waited, unseen: the stalls it had measured were kept, and it had measured
    none. Measures failing for stall_after now say so, until one works again."""
    storage = _Backlogs()
    await storage.register_topics({TOPIC: 2})
    monitor = BacklogMonitor(
        storage,
        settings(metrics_interval=0.02, connect_timeout=0.05, stall_after=0.3),
        metrics()[0],
    )
    task = asyncio.create_task(monitor.run())
    try:
        await until(lambda: monitor.backlog == {}, "the backlog measured")
        storage.outcomes.extend(["down"] * 1000)
        await until(lambda: monitor.backlog is None, "a failed measure")
        assert monitor.unreadable_for() is None  # not for stall_after yet
        await until(lambda: monitor.unreadable_for() is not None, "unreadable for stall_after")
        storage.outcomes.clear()
        await until(lambda: monitor.unreadable_for() is None, "readable again")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Group:
    """The membership :class:`~outboxkit.core.step_aside.StepAside` drives: what it was told,
    in order."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    async def step_aside(self) -> None:
        self.steps.append("aside")

    def step_in(self) -> None:
        self.steps.append("in")


async def test_a_relay_that_cannot_read_its_database_steps_aside_and_rejoins_once_it_answers() -> (
    None
):
    """A relay behind a half-open database link kept its partitions for the whole fault (its
    heartbeats went on, and on MongoDB its sessions stayed open): they waited, while the other
    relays could have published them. Would catch a relay that stays in its group once every
    measure has failed and nothing was published for step_aside_after, one that leaves sooner
    or while it still publishes (a slow backlog query is no reason to leave), one that leaves
    twice, or one that stays out once its database answers."""
    storage = _Backlogs()
    await storage.register_topics({TOPIC: 2})
    relay_metrics, registry = metrics()
    monitor = BacklogMonitor(
        storage,
        settings(metrics_interval=0.02, connect_timeout=1.0, step_aside_after=0.3),
        relay_metrics,
    )
    group = _Group()
    published_ago: list[float | None] = [None]
    aside = StepAside(
        monitor.unanswered_for,
        group,
        monitor.settings.step_aside_after,
        others="the other relays publish this relay's partitions",
        gauge=relay_metrics.stepped_aside.set,
        log=structlog.get_logger("outboxkit.relay"),
        since_progress=lambda: published_ago[0],
    )

    def stepped_aside() -> float | None:
        return registry.get_sample_value("outboxkit_relay_stepped_aside")

    task = asyncio.create_task(monitor.run())
    try:
        await until(lambda: monitor.backlog == {}, "the backlog measured")
        await aside.check()
        # A half-open link: the measure in flight waits (up to connect_timeout, 1 s) and counts
        # from its start, then the next ones fail at once.
        storage.outcomes.extend(["hang"] + ["down"] * 100_000)
        await until(lambda: storage.outcomes[0] == "down", "a measure waiting on the database")
        await aside.check()
        assert group.steps == []  # not for step_aside_after yet
        await until(lambda: (monitor.unanswered_for() or 0) >= 0.3, "no answer for 0.3 s")
        assert monitor.backlog is not None  # the measure has not even failed yet
        published_ago[0] = 0.1
        await aside.check()
        assert group.steps == []  # it still publishes
        published_ago[0] = 0.3
        with structlog.testing.capture_logs() as logs:
            await aside.check()
            await aside.check()
        assert group.steps == ["aside"]
        assert [e["event"] for e in logs] == [
            "the database does not answer: leaving the group so that the other relays publish "
            "this relay's partitions"
        ]
        assert stepped_aside() == 1
        assert aside.aside_for() is not None
        await until(lambda: monitor.backlog is None, "the measure failed")
        await aside.check()
        storage.outcomes.clear()
        await until(lambda: monitor.unanswered_for() is None, "a measure answered")
        await aside.check()
        await aside.check()
        assert group.steps == ["aside", "in"]
        assert (stepped_aside(), aside.aside_for()) == (0, None)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_watch_logs_a_long_stage_once_per_interval_and_failures_with_their_backlog() -> (
    None
):
    """Would catch a watch that logs a slow stage or a failing broker once per check (a line
    per second per block) or forgets the partitions and backlog an operator needs."""
    storage = SpyStorage()
    await storage.register_topics({TOPIC: 2})
    storage.add(Ping(key=keys_on(0, 2)[0]))
    monitor = BacklogMonitor(storage, settings(), metrics()[0])
    await monitor.measure()
    slow = Worker(Block(TOPIC, 0, 0), [tp(0)], stage="send", stage_since=100.0)
    failing = Worker(Block(TOPIC, 1, 0), [tp(1)], failing_since=100.0, last_error="down")
    watch = StageWatch(Blocks(slow, failing), monitor, settings(slow_after=5.0))
    with structlog.testing.capture_logs() as logs:
        for now in (106.0, 107.0, 108.0, 112.0, 137.0):
            watch.check(now)
    events = [(e["event"], e.get("seconds") or e.get("failing_for")) for e in logs]
    assert events == [
        ("relay stage running long", 6.0),
        ("cannot publish", 6.0),
        ("cannot publish", 12.0),
        ("relay stage running long", 37.0),
        ("cannot publish", 37.0),
    ]
    report = next(e for e in logs if e["event"] == "cannot publish")
    assert (report["partitions"], report["error"], report["backlog"]) == (["t/1"], "down", 0)
    assert next(e for e in logs if e["event"] == "relay stage running long")["partitions"] == [
        "t/0"
    ]


@dataclass
class Purges:
    """An outbox with ``kept`` published records past their retention."""

    kept: int
    calls: list[int] = field(default_factory=list)

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        deleted = min(self.kept, limit)
        self.kept -= deleted
        self.calls.append(deleted)
        return deleted


async def test_the_purge_deletes_in_batches_until_a_short_one_then_waits() -> None:
    """G7: would catch a purge that stops after one batch (storage grows) or deletes all in
    one statement."""
    outbox = Purges(kept=25)
    configured = settings(retention=60.0, cleanup_batch=10, cleanup_interval=30.0)
    task = asyncio.create_task(clean_up(cast(OutboxStorage, outbox), configured))
    try:
        await until(lambda: outbox.calls == [10, 10, 5], "three batches")

        async def waiting_for_the_interval() -> None:
            assert outbox.calls == [10, 10, 5], "then waits for the interval"

        await holds_for(0.05, waiting_for_the_interval, interval=0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- departed relays ---------------------------------------------------------------------------


async def test_the_check_announces_this_process_and_evicts_the_departed_ones() -> None:
    """Would catch a dead relay left in the group until its session timeout, or a live one
    (or this one) evicted."""
    storage = SpyStorage()
    group = ManualOwnership({TOPIC: 1})
    group.others = {"dead", "alive"}
    configured = settings(departed_check_interval=30.0)
    m, registry = metrics()
    check = DepartedCheck(configured, storage, group, m)
    await check.announce()
    assert storage.announced(configured.group_id) == ["manual-process"]
    for other in ("dead", "alive"):
        await storage.announce_member(configured.group_id, other)
    storage.end_session(configured.group_id, "dead")
    task = asyncio.create_task(check.run())
    try:
        await until(lambda: group.evicted == ["dead"], "the dead evicted")
        assert group.others == {"alive"}
        assert registry.get_sample_value("outboxkit_relay_departed_members_removed_total") == 1
        # An assignment makes it look again at once, not after the 30 s interval.
        storage.end_session(configured.group_id, "alive")
        check.assigned()
        await until(lambda: group.evicted == ["dead", "alive"], "checked again on assignment")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_departure_found_while_kafka_is_down_is_evicted_once_it_is_back() -> None:
    """Would catch a departure forgotten when Kafka could not be told: after a broker restart
    the coordinator loads the dead relay's member from its log, and every rebalance would wait
    for its session timeout (the churn benchmark's 2.4x)."""
    storage = SpyStorage()
    group = ManualOwnership({TOPIC: 1})
    group.others = {"dead"}
    check = DepartedCheck(settings(), storage, group, metrics()[0])
    await check.announce()
    await storage.announce_member(check.settings.group_id, "dead")
    storage.end_session(check.settings.group_id, "dead")
    group.evict_error = NodeNotReadyError("the broker is down")
    for _ in range(2):
        await check.check()
    assert group.evicted == []
    group.evict_error = None
    await check.check()
    assert group.evicted == ["dead"]
    assert await storage.departed_members(check.settings.group_id, "manual-process") == []


async def test_a_check_the_storage_refuses_warns_once_a_minute_and_never_raises() -> None:
    class Refusing(SpyStorage):
        async def announce_member(self, group: str, member_id: str) -> None:
            raise RuntimeError("permission denied for table relay_members")

    check = DepartedCheck(settings(), Refusing(), ManualOwnership({TOPIC: 1}), metrics()[0])
    with structlog.testing.capture_logs() as logs:
        await check.announce()
        for _ in range(3):
            await check.check()
    assert [e["event"] for e in logs] == [
        "cannot check for dead relays; they leave the group at their session timeout"
    ]


@pytest.mark.parametrize(
    ("values", "wanted"),
    [
        ({}, True),
        ({"departed_check_interval": 0}, False),
        ({"instance_id": "relay-1"}, False),
    ],
    ids=["default", "check-off", "static-membership"],
)
def test_the_check_runs_only_with_dynamic_membership(values: dict[str, Any], wanted: bool) -> None:
    assert DepartedCheck.wanted(settings(**values)) is wanted
