"""The relay's side tasks beside its block workers: wake-ups, the backlog, the watch, the purge.
Stepping aside while the database does not answer is :mod:`outboxkit.core.step_aside`'s, on
the backlog monitor's clock.

Each runs until cancelled, under :class:`~outboxkit.core.supervisor.Supervisor`; the check for
departed relays is :mod:`outboxkit.relay.departed`. None of them publishes: they route hints to
the workers, measure, log and delete what outlived its retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from outboxkit.core.waiting import sleep_unless_cancelled
from outboxkit.relay.blocks import Block
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage, WakeupSource
from outboxkit.relay.worker import BlockWorker

logger = structlog.get_logger("outboxkit.relay")

#: While a block keeps failing, one warning this often (plus the first failure of each streak).
_FAILING_LOG_EVERY = 5.0

#: A stage still running after ``slow_after`` is logged again this often.
_SLOW_LOG_EVERY = 30.0

#: Once measures have failed for ``step_aside_after`` (the relay has left its group), the next
#: comes this soon (or at ``metrics_interval``, if sooner): a measure that answers is what
#: brings the relay back, within a second (:mod:`outboxkit.core.step_aside`).
_RETRY_MEASURE_AFTER = 1.0

__all__ = [
    "BacklogMonitor",
    "RunningBlocks",
    "StageWatch",
    "clean_up",
    "dispatch_wakeups",
]


class RunningBlocks(Protocol):
    """The block workers running now: a
    :class:`~outboxkit.relay.reconciler.PartitionReconciler`."""

    @property
    def workers(self) -> list[BlockWorker]: ...

    def worker_of(self, tp: TopicPartition) -> BlockWorker | None: ...


async def dispatch_wakeups(
    wakeups: WakeupSource, blocks: RunningBlocks, metrics: RelayMetrics
) -> None:
    """Wake the worker of each partition a writer committed to; every worker after a
    reconnect (``None``: notifications may have been missed, and the database may have lost
    the workers' idle declarations: each declares again)."""
    async for tp in wakeups.wakeups():
        if tp is None:
            metrics.wakeups.labels("reconnect").inc()
            for worker in blocks.workers:
                worker.reconnected()
        elif (owner := blocks.worker_of(tp)) is not None:
            owner.wake(tp)


@dataclass
class BacklogMonitor:
    """Measures the outbox's backlog every ``metrics_interval`` for the metrics, the health and
    the watch; a partition is *stalled* when its oldest pending record is older than
    ``stall_after``.

    A measure that fails, or does not answer within the interval (or ``connect_timeout``, if
    longer), is given up until the next: the counts it would have replaced are forgotten
    (``/healthz`` shows ``pending: null``, not numbers that may be long gone), ``stalled`` is
    kept (a database that cannot be read is no reason to answer healthy), and a warning says so
    once per streak; past ``step_aside_after`` the next comes within a second. Measures failing for
    ``stall_after`` make the relay unhealthy (:meth:`unreadable_for`): whatever is pending has
    waited at least that long, unseen."""

    storage: OutboxStorage
    settings: RelaySettings
    metrics: RelayMetrics
    #: Per partition, as last measured; ``None`` until the first measure, and after a failed one.
    backlog: dict[TopicPartition, PartitionBacklog] | None = field(default=None, init=False)
    stalled: set[TopicPartition] = field(default_factory=set, init=False)
    _failing: bool = field(default=False, init=False)
    #: Monotonic time the oldest measure without an answer began: the one in flight, or the
    #: first of those that failed in a row. None once one answers.
    _unanswered_since: float | None = field(default=None, init=False)

    def unanswered_for(self) -> float | None:
        """Seconds since the oldest measure that has had no answer began (one in flight counts:
        on a half-open link a measure waits up to ``connect_timeout`` before it fails); None
        while the last one answered."""
        if self._unanswered_since is None:
            return None
        return time.monotonic() - self._unanswered_since

    def unreadable_for(self) -> float | None:
        """Seconds the database has answered no measure, once that is ``stall_after`` or
        longer (a relay whose database does not answer, or not within the interval); else
        None."""
        unanswered = self.unanswered_for()
        if unanswered is None or unanswered < self.settings.stall_after:
            return None
        return unanswered

    def _retry_in(self) -> float:
        """The usual interval while measures fail — a database in trouble is not asked more
        often — but a second at most once they have failed for ``step_aside_after``."""
        bound = self.settings.step_aside_after
        unanswered = self.unanswered_for() or 0.0
        if bound > 0 and unanswered >= bound:
            return min(self.settings.metrics_interval, _RETRY_MEASURE_AFTER)
        return self.settings.metrics_interval

    def pending(self, tps: set[TopicPartition]) -> int:
        """Records pending in ``tps``, as last measured."""
        return sum(b.pending for tp, b in (self.backlog or {}).items() if tp in tps)

    async def measure(self) -> None:
        backlog = await self.storage.backlog()
        now = time.time()
        self.metrics.observe_backlog(backlog, now)
        self.backlog = {TopicPartition(b.topic, b.partition): b for b in backlog}
        self.stalled = {
            TopicPartition(b.topic, b.partition)
            for b in backlog
            if b.pending and b.age(now) > self.settings.stall_after
        }

    async def run(self) -> None:
        within = max(self.settings.metrics_interval, self.settings.connect_timeout)
        while True:
            if self._unanswered_since is None:
                self._unanswered_since = time.monotonic()
            try:
                async with asyncio.timeout(within):
                    await self.measure()
            except (StorageUnavailableError, TimeoutError) as exc:
                self.backlog = None
                if not self._failing:
                    logger.warning(
                        "cannot measure the backlog",
                        error=repr(exc),
                        retry_in=self.settings.metrics_interval,
                    )
                self._failing = True
                await sleep_unless_cancelled(self._retry_in())
            else:
                self._failing = False
                self._unanswered_since = None
                await sleep_unless_cancelled(self.settings.metrics_interval)


@dataclass
class StageWatch:
    """Says when a stage runs long (which partitions, which stage) and, while publishing fails
    (broker or database unreachable), says so every few seconds with the backlog and the time
    since the last success, instead of one line per retry."""

    blocks: RunningBlocks
    backlog: BacklogMonitor
    settings: RelaySettings
    _slow_logged: dict[Block, float] = field(default_factory=dict, init=False)
    _failing_logged: float = field(default=0.0, init=False)

    async def run(self) -> None:
        while True:
            await sleep_unless_cancelled(1.0)
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """Log what runs long or fails at ``now`` (monotonic), unless logged recently."""
        failing = []
        for worker in self.blocks.workers:
            running = now - worker.stage_since
            if worker.stage is not None and running >= self.settings.slow_after:
                if now - self._slow_logged.get(worker.block, 0.0) >= _SLOW_LOG_EVERY:
                    self._slow_logged[worker.block] = now
                    logger.warning(
                        "relay stage running long",
                        stage=worker.stage,
                        seconds=round(running, 1),
                        partitions=[str(tp) for tp in worker.tps],
                    )
            else:
                self._slow_logged.pop(worker.block, None)
            if worker.failing_since is not None and now - worker.failing_since >= 1.0:
                failing.append(worker)
        if failing and now - self._failing_logged >= _FAILING_LOG_EVERY:
            self._failing_logged = now
            tps = [tp for w in failing for tp in w.tps]
            since = [now - w.last_success for w in failing if w.last_success is not None]
            logger.warning(
                "cannot publish",
                error=failing[0].last_error,
                partitions=[str(tp) for tp in tps],
                backlog=self.backlog.pending(set(tps)),
                seconds_since_success=round(max(since), 1) if since else None,
                failing_for=round(now - min(w.failing_since or now for w in failing), 1),
            )


async def clean_up(storage: OutboxStorage, settings: RelaySettings) -> None:
    """Purge the published records kept longer than ``retention`` (G7), every
    ``cleanup_interval``, in small batches until a short one: each is a quick statement of its
    own."""
    assert settings.retention is not None
    while True:
        with contextlib.suppress(StorageUnavailableError):
            deleted = settings.cleanup_batch
            while deleted == settings.cleanup_batch:
                deleted = await storage.purge_published(settings.retention, settings.cleanup_batch)
        await sleep_unless_cancelled(settings.cleanup_interval)
