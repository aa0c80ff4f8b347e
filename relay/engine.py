"""The relay engine: owned partitions → claim the head → publish → delete. Storage-agnostic.

One worker task per owned partition runs the cycle below; the engine starts and stops workers
as Kafka assigns and revokes partitions, routes wake-ups to them, and supervises side tasks
(cleanup, metrics): if one dies, the relay stops loudly instead of running half-blind.

    cycle (one partition):
        records = head of the partition, oldest first         (storage.fetch_pending)
        keep the first record of each key                     (per-key barrier, guarantee G2)
        publish them: one Kafka transaction                   (publisher.publish)
        delete them (or mark published)                       (storage.mark_published)

A batch never holds two records of one key, so a crash between Kafka's commit and the delete
can only repeat the latest record of a key (``R0 R1 R1 R2``), never put an older one after a
newer one. Nothing is claimed in the database: a stale relay is fenced by Kafka (see
:mod:`outboxkit.relay.publisher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from outboxkit.core.kafka import leave_group
from outboxkit.relay.exceptions import OwnershipLostError, StorageUnavailableError
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.ownership import KafkaOwnership, PartitionsCallback
from outboxkit.relay.publisher import KafkaPublisher, Publisher, PublisherFactory
from outboxkit.relay.records import OutboxRecord, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage, WakeupSource

logger = structlog.get_logger("outboxkit.relay")

#: Going idle, a relay waits (polling with backoff, at most this long) until every writer
#: transaction open at its declaration has ended, then looks once more (see _await_writers).
_WRITERS_WAIT_MAX = 1.0

#: Stopping, a cancelled task has this long to finish before it is left behind (logged).
_CANCEL_GRACE = 5.0


async def _settle(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Wait for ``tasks`` (ending or cancelled) to finish, but not forever: one that ignores
    its cancellation (a library call stuck on the network) is logged with where it is stuck
    and left behind, so that stopping a relay never hangs."""
    if not tasks:
        return
    done, stuck = await asyncio.wait(tasks, timeout=_CANCEL_GRACE)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: whoever cares reported it already
    for task in stuck:
        where = [f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack(limit=4)]
        logger.error(
            "task did not stop when cancelled, left behind", task=task.get_name(), at=where
        )


class Ownership(Protocol):
    """Consumer-group membership: calls back on assignment and revocation."""

    async def start(self) -> dict[str, int]:
        """Join; return each topic's partition count."""

    def partition_counts(self) -> dict[str, int]:
        """Each topic's partition count as known now (it may have grown since start)."""

    async def run(self) -> None:
        """Stay a member until cancelled."""

    async def stop(self) -> None:
        """Leave (revocation drains first)."""


OwnershipFactory = Callable[[RelaySettings, PartitionsCallback, PartitionsCallback], Ownership]


def _kafka_ownership(
    settings: RelaySettings, on_assigned: PartitionsCallback, on_revoked: PartitionsCallback
) -> Ownership:
    return KafkaOwnership(settings, on_assigned=on_assigned, on_revoked=on_revoked)


class _RetryLater(Exception):
    """Records were rejected: back off before their next attempt."""


_RETRIABLE = (StorageUnavailableError, KafkaError, OSError, _RetryLater)


@dataclass
class RelayHealth:
    """What a liveness/readiness probe reports. ``healthy`` is false when the relay is not
    running or an owned partition has had pending records for longer than ``stall_after``."""

    running: bool
    owned: list[str]
    stalled: list[str]
    seconds_since_progress: float | None
    last_error: str | None
    #: Owned per the group, but another relay's producer fenced ours (a rebalance is coming).
    fenced: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.running and not self.stalled


def first_per_key(records: Sequence[OutboxRecord]) -> list[OutboxRecord]:
    """The oldest record of each key, in id order: at most one record per key in flight."""
    seen: set[bytes] = set()
    batch = []
    for record in records:
        if record.key not in seen:
            seen.add(record.key)
            batch.append(record)
    return batch


class _InFlightBudget:
    """Bounds the records sent and not yet confirmed, over all partitions."""

    def __init__(self, limit: int, metrics: RelayMetrics) -> None:
        self._free = limit
        self._limit = limit
        self._changed = asyncio.Condition()
        self._metrics = metrics

    async def take(self, want: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self._free > 0)
            granted = min(want, self._free)
            self._free -= granted
            self._metrics.in_flight.set(self._limit - self._free)
            return granted

    async def give(self, count: int) -> None:
        async with self._changed:
            self._free += count
            self._metrics.in_flight.set(self._limit - self._free)
            self._changed.notify_all()


@dataclass
class _Worker:
    tp: TopicPartition
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    publisher: Publisher | None = None


class Relay:
    """Publishes the outbox of ``storage`` to Kafka for the partitions this instance owns,
    woken by ``wakeups`` when writers commit.

    ``await relay.run()`` runs until :meth:`stop` (e.g. on SIGTERM): it then stops claiming,
    lets in-flight batches finish, leaves the consumer group and returns."""

    def __init__(
        self,
        settings: RelaySettings,
        storage: OutboxStorage,
        wakeups: WakeupSource,
        *,
        metrics: RelayMetrics | None = None,
        publisher_factory: PublisherFactory | None = None,
        ownership_factory: OwnershipFactory = _kafka_ownership,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.wakeups = wakeups
        self.metrics = metrics or RelayMetrics()
        self._publisher_factory = publisher_factory or (lambda tp: KafkaPublisher(tp, settings))
        self._ownership_factory = ownership_factory
        self._workers: dict[TopicPartition, _Worker] = {}
        self._budget = _InFlightBudget(settings.max_in_flight, self.metrics)
        self._stopping = asyncio.Event()
        self._running = False
        self._last_progress: float | None = None
        self._last_error: str | None = None
        self._stalled: set[TopicPartition] = set()
        self._fenced: set[TopicPartition] = set()
        self._worker_failed = asyncio.Event()
        self._worker_error: BaseException | None = None
        self._ownership: Ownership | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        ownership = self._ownership_factory(self.settings, self.assign, self.revoke)
        self._ownership = ownership
        partitions = await ownership.start()
        side_tasks: list[asyncio.Task[Any]] = []
        stopping = asyncio.create_task(self._stopping.wait(), name="stop")
        try:
            registering = asyncio.create_task(self._register_topics(partitions))
            await asyncio.wait([stopping, registering], return_when="FIRST_COMPLETED")
            if not registering.done():  # stopped while the database is away
                registering.cancel()
                await asyncio.gather(registering, return_exceptions=True)
                return
            registering.result()
            self._running = True
            side_tasks += [
                asyncio.create_task(ownership.run(), name="ownership"),
                asyncio.create_task(self._dispatch_wakeups(), name="wakeups"),
                asyncio.create_task(self._measure_backlog(), name="metrics"),
                asyncio.create_task(self._worker_failed.wait(), name="partition worker"),
            ]
            if self.settings.retention is not None:
                side_tasks.append(asyncio.create_task(self._clean_up(), name="cleanup"))
            done, _ = await asyncio.wait([stopping, *side_tasks], return_when="FIRST_COMPLETED")
            for task in done:
                if task.get_name() == "partition worker" and self._worker_error is not None:
                    raise self._worker_error
                if task is not stopping:
                    # A side task never ends by itself: its exception stops the relay.
                    task.result()
                    raise RuntimeError(f"relay task {task.get_name()} ended unexpectedly")
        finally:
            self._running = False
            for task in [stopping, *side_tasks]:
                task.cancel()
            await _settle([*side_tasks, stopping])
            await self.revoke(frozenset(self._workers))
            await leave_group(
                ownership.stop(),
                within=self.settings.revoke_timeout + self.settings.session_timeout,
                who=self.settings.group_id,
            )
            logger.info("relay stopped")

    async def _register_topics(self, partitions: dict[str, int]) -> None:
        """Writers need the partition counts: keep trying while the database is away."""
        async for attempt in self._retrying(logger):
            with attempt:
                await self.storage.register_topics(partitions)

    def stop(self) -> None:
        """Ask :meth:`run` to drain and return."""
        self._stopping.set()

    def health(self) -> RelayHealth:
        since = None if self._last_progress is None else time.monotonic() - self._last_progress
        return RelayHealth(
            running=self._running,
            owned=sorted(str(tp) for tp in self._workers),
            stalled=sorted(str(tp) for tp in self._stalled if tp in self._workers),
            fenced=sorted(str(tp) for tp in self._fenced if tp in self._workers),
            seconds_since_progress=since,
            last_error=self._last_error,
        )

    # -- ownership ---------------------------------------------------------------------------

    async def assign(self, partitions: frozenset[TopicPartition]) -> None:
        self.metrics.rebalances.inc()
        if self._ownership is not None:
            # Kafka rebalances when a subscribed topic gains partitions: writers must learn the
            # new count. Best effort; the next rebalance or restart tries again.
            try:
                await self.storage.register_topics(self._ownership.partition_counts())
            except Exception as exc:  # never keep the workers below from starting
                logger.warning("could not record the partition counts", error=repr(exc))
        for tp in partitions:
            if tp not in self._workers:
                self._fenced.discard(tp)
                worker = _Worker(tp)
                worker.task = asyncio.create_task(self._work(worker), name=f"partition {tp}")
                worker.task.add_done_callback(self._on_worker_done)
                self._workers[tp] = worker
        self.metrics.owned_partitions.set(len(self._workers))

    def _on_worker_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._worker_error = task.exception()
            self._worker_failed.set()

    async def revoke(self, partitions: frozenset[TopicPartition]) -> None:
        """Stop the workers of ``partitions`` and wait for their in-flight batch (bounded)."""
        workers = [self._workers.pop(tp) for tp in partitions if tp in self._workers]
        for worker in workers:
            worker.stop.set()
            worker.wake.set()
        tasks = [w.task for w in workers if w.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.settings.revoke_timeout)
            for task in late:
                logger.warning(
                    "partition did not drain in time, abandoning it", task=task.get_name()
                )
                task.cancel()
            await _settle(tasks)
        self.metrics.owned_partitions.set(len(self._workers))

    # -- one partition -----------------------------------------------------------------------

    async def _work(self, worker: _Worker) -> None:
        tp = worker.tp
        waiting = False
        log = logger.bind(partition=str(tp))
        try:
            while not worker.stop.is_set():
                try:
                    async for attempt in self._retrying(log, worker.stop):
                        with attempt:
                            if worker.stop.is_set():
                                return  # revoked during a backoff: start nothing new
                            published = await self._cycle(worker, log)
                except OwnershipLostError as exc:
                    log.warning("partition fenced: another relay owns it now", error=str(exc))
                    if self._workers.get(tp) is worker:  # not a worker left behind at revoke
                        self._fenced.add(tp)
                    self.metrics.publish_errors.labels(tp.topic, "fenced").inc()
                    return
                if published:
                    if waiting:
                        waiting = await self._set_waiting(tp, False)
                    continue
                if not waiting:
                    # Declare idle, then look once more when the writers that may have missed
                    # the declaration are done: they sent no notification.
                    waiting = await self._set_waiting(tp, True)
                    await self._await_writers(worker)
                    continue
                reason = await self._wait(worker, self.settings.sweep_interval)
                self.metrics.wakeups.labels(reason).inc()
        finally:
            if waiting:
                with contextlib.suppress(Exception):
                    await self._set_waiting(tp, False)
            await self._drop_publisher(worker)

    async def _publisher(self, worker: _Worker) -> Publisher:
        if worker.publisher is None:
            worker.publisher = self._publisher_factory(worker.tp)
            try:
                async with asyncio.timeout(self.settings.publish_timeout):
                    await worker.publisher.start()  # fences the previous owner
            except BaseException:
                await self._drop_publisher(worker)
                raise
        return worker.publisher

    async def _drop_publisher(self, worker: _Worker) -> None:
        """After a Kafka error the producer may be in any state: the next attempt starts a
        fresh one (which, with transactions, also aborts whatever this one left open)."""
        if worker.publisher is not None:
            publisher, worker.publisher = worker.publisher, None
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.settings.publish_timeout):
                    await publisher.close()

    def _retrying(
        self, log: structlog.typing.FilteringBoundLogger, stop: asyncio.Event | None = None
    ) -> AsyncRetrying:
        async def sleep(seconds: float) -> None:
            # A revocation cuts the backoff short.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await (stop or asyncio.Event()).wait()

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            self._last_error = repr(error)
            log.warning(
                "retrying after error",
                error=repr(error),
                attempt=state.attempt_number,
                wait=round(state.upcoming_sleep, 3),
            )

        return AsyncRetrying(
            retry=retry_if_exception_type(_RETRIABLE),
            wait=wait_exponential_jitter(
                multiplier=0.05, max=self.settings.retry_backoff_max, jitter=0.2
            ),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )

    async def _cycle(self, worker: _Worker, log: structlog.typing.FilteringBoundLogger) -> bool:
        """Publish one batch of the worker's partition; return whether there was any."""
        tp = worker.tp
        worker.wake.clear()
        publisher = await self._publisher(worker)
        batch = first_per_key(await self.storage.fetch_pending(tp, self.settings.batch_size))
        if not batch:
            return False
        # Count what is really sent against the bound, not what might have been.
        granted = await self._budget.take(len(batch))
        batch = batch[:granted]
        try:
            try:
                async with asyncio.timeout(self.settings.publish_timeout):
                    outcome = await publisher.publish(batch)
            except OwnershipLostError:
                raise
            except Exception:
                self.metrics.publish_errors.labels(tp.topic, "retriable").inc()
                await self._drop_publisher(worker)
                raise
            # Kafka has them: only now may they leave the outbox.
            await self.storage.mark_published(
                outcome.published, keep=self.settings.retention is not None
            )
        finally:
            await self._budget.give(granted)
        self._observe(tp, outcome.published)
        give_up_any = False
        for record, error in outcome.rejected:
            give_up = record.attempts + 1 >= self.settings.max_attempts
            give_up_any |= give_up
            await self.storage.record_failure(record, error, give_up=give_up)
            self.metrics.publish_errors.labels(tp.topic, "rejected").inc()
            if give_up:
                self.metrics.parked.labels(tp.topic).inc()
            log.error(
                "record parked as failed" if give_up else "record rejected by Kafka",
                event_id=str(record.event_id),
                attempts=record.attempts + 1,
                error=error,
            )
        if outcome.rejected and not give_up_any:
            raise _RetryLater
        return True

    def _observe(self, tp: TopicPartition, published: Sequence[OutboxRecord]) -> None:
        if not published:
            return
        now = time.time()
        self._last_progress = time.monotonic()
        self.metrics.batches.labels(tp.topic).inc()
        self.metrics.published.labels(tp.topic).inc(len(published))
        latency = self.metrics.latency.labels(tp.topic)
        for record in published:
            if record.created_at is not None:
                latency.observe(max(now - record.created_at.timestamp(), 0.0))

    async def _set_waiting(self, tp: TopicPartition, waiting: bool) -> bool:
        try:
            await self.wakeups.set_waiting(tp, waiting)
        except StorageUnavailableError:
            return False  # no wake-ups then: the sweep still runs
        return waiting

    async def _await_writers(self, worker: _Worker) -> None:
        """Until every writer transaction that was open when ``worker``'s partition was declared
        idle has ended (its trigger may have run before the declaration was visible, so it sent
        no wake-up; its row is visible afterwards), a wake-up arrives, or a bound passes (a
        long transaction elsewhere on the server holds the horizon back: the sweep covers it)."""
        delay, deadline = 0.002, time.monotonic() + _WRITERS_WAIT_MAX
        while not worker.stop.is_set() and time.monotonic() < deadline:
            try:
                if await self.wakeups.writers_settled(worker.tp):
                    return
            except StorageUnavailableError:
                return  # the next read fails too and is retried
            if await self._wait(worker, delay) == "notify":
                return
            delay = min(delay * 2, 0.1)

    async def _wait(self, worker: _Worker, seconds: float) -> str:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await worker.wake.wait()
                return "notify"
        return "sweep"

    # -- side tasks --------------------------------------------------------------------------

    async def _dispatch_wakeups(self) -> None:
        async for tp in self.wakeups.wakeups():
            if tp is None:
                self.metrics.wakeups.labels("reconnect").inc()
                for worker in self._workers.values():
                    worker.wake.set()
            elif tp in self._workers:
                self._workers[tp].wake.set()

    async def _measure_backlog(self) -> None:
        while True:
            with contextlib.suppress(StorageUnavailableError):
                backlog = await self.storage.backlog()
                now = time.time()
                self.metrics.observe_backlog(backlog, now)
                self._stalled = {
                    TopicPartition(b.topic, b.partition)
                    for b in backlog
                    if b.oldest_created_at is not None
                    and now - b.oldest_created_at.timestamp() > self.settings.stall_after
                }
            await asyncio.sleep(self.settings.metrics_interval)

    async def _clean_up(self) -> None:
        assert self.settings.retention is not None
        while True:
            with contextlib.suppress(StorageUnavailableError):
                # Small batches until a short one: each is a quick statement of its own.
                deleted = self.settings.cleanup_batch
                while deleted == self.settings.cleanup_batch:
                    deleted = await self.storage.purge_published(
                        self.settings.retention, self.settings.cleanup_batch
                    )
            await asyncio.sleep(self.settings.cleanup_interval)
