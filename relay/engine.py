"""The relay engine: owned partitions → blocks → one publishing loop per block. Storage-agnostic.

The engine joins the relay's consumer group (:mod:`outboxkit.relay.ownership`); the partitions
it owns are grouped into blocks (:mod:`outboxkit.relay.blocks`), each published by one
:class:`~outboxkit.relay.worker.BlockWorker` with its own transactional producer. The engine
starts and stops workers as partitions come and go, routes wake-ups to them, and supervises side
tasks (cleanup, metrics, the watch on slow stages and failures): if one dies, the relay stops
loudly instead of running half-blind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from aiokafka.errors import KafkaError

from outboxkit.core.kafka import leave_group
from outboxkit.relay.batches import InFlightBudget
from outboxkit.relay.blocks import Block, plan
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.fencing import Fencer, KafkaFencer
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.ownership import KafkaOwnership, PartitionsCallback
from outboxkit.relay.publisher import KafkaPublisher, PublisherFactory, describe
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage, WakeupSource
from outboxkit.relay.worker import BlockWorker, WorkerContext

logger = structlog.get_logger("outboxkit.relay")

#: Stopping, a cancelled task has this long to finish before it is left behind (logged).
_CANCEL_GRACE = 5.0

#: While a block keeps failing, one warning this often (plus the first failure of each streak).
_FAILING_LOG_EVERY = 5.0

#: A stage still running after ``slow_after`` is logged again this often.
_SLOW_LOG_EVERY = 30.0

#: A check for dead relays that keeps failing for a reason other than an outage (a missing
#: privilege) is logged this often.
_REFUSED_LOG_EVERY = 60.0
#: A block's worker that failed unexpectedly restarts after 0.5 s, then twice as long after each
#: further failure, up to 30 s; failures more than 5 minutes apart count as the first again.
_CRASH_BACKOFF = 0.5
_CRASH_BACKOFF_MAX = 30.0
_CRASH_MEMORY = 300.0

__all__ = ["Ownership", "PartitionStatus", "Relay", "RelayHealth"]


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

    async def confirm(self, partitions: frozenset[TopicPartition]) -> bool:
        """Whether this member is in the group's current generation and owns ``partitions``."""

    @property
    def member_id(self) -> str | None:
        """This member's id in the group, once joined."""

    @property
    def process_key(self) -> str:
        """What this relay process announces in the database (its presence): unique to the
        process and known before it joins — Kafka names a member only once its join completes,
        which after a broker restart can take the process's whole life — and the client id
        Kafka lists for its member."""

    async def evict_process(self, process_key: str) -> int:
        """Remove from the group now every member of the process announced as ``process_key``;
        how many there were."""

    async def stop(self) -> None:
        """Leave (revocation drains first)."""


OwnershipFactory = Callable[[RelaySettings, PartitionsCallback, PartitionsCallback], Ownership]
FencerFactory = Callable[[RelaySettings], Fencer]


def _kafka_ownership(
    settings: RelaySettings, on_assigned: PartitionsCallback, on_revoked: PartitionsCallback
) -> Ownership:
    return KafkaOwnership(settings, on_assigned=on_assigned, on_revoked=on_revoked)


@dataclass
class PartitionStatus:
    """One owned partition, as ``/healthz`` and ``outboxkit relay status`` show it."""

    partition: str
    #: The block (one Kafka transaction per batch) that publishes it, e.g. ``orders/0-7``.
    block: str
    pending: int | None = None
    failed: int | None = None
    oldest_pending_age: float | None = None
    #: When a record of it was last acknowledged by Kafka (ISO 8601, UTC).
    last_publish_at: str | None = None
    fenced: bool = False


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
    #: This relay's consumer-group member id (``outboxkit relay status`` lists every member).
    member_id: str | None = None
    partitions: list[PartitionStatus] = field(default_factory=list)
    #: Owned partitions whose worker failed unexpectedly and waits to be restarted.
    crashed: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.running and not self.stalled and not self.crashed


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
        fencer_factory: FencerFactory = KafkaFencer,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.wakeups = wakeups
        self.metrics = metrics or RelayMetrics()
        self._publisher_factory = publisher_factory or (lambda b: KafkaPublisher(b, settings))
        self._ownership_factory = ownership_factory
        self._fencer_factory = fencer_factory
        self._owned: set[TopicPartition] = set()
        self._counts: dict[str, int] = {}
        self._workers: dict[Block, BlockWorker] = {}
        self._by_tp: dict[TopicPartition, BlockWorker] = {}
        self._reconciling = asyncio.Lock()
        self._budget = InFlightBudget(settings.max_in_flight, self.metrics)
        self._stopping = asyncio.Event()
        self._running = False
        self._last_progress: float | None = None
        self._last_error: str | None = None
        self._stalled: set[TopicPartition] = set()
        self._backlog: dict[TopicPartition, PartitionBacklog] = {}
        self._backlog_at = 0.0
        #: Per block: consecutive unexpected failures, and when the last one was.
        self._crashes: dict[Block, tuple[int, float]] = {}
        self._restarts: dict[Block, asyncio.TimerHandle] = {}
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._assigned = asyncio.Event()
        self._ownership: Ownership | None = None
        self._fencer: Fencer | None = None
        self._ctx: WorkerContext | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        ownership = self._ownership_factory(self.settings, self.assign, self.revoke)
        self._ownership = ownership
        self._fencer = self._fencer_factory(self.settings)
        self._ctx = WorkerContext(
            settings=self.settings,
            storage=self.storage,
            wakeups=self.wakeups,
            metrics=self.metrics,
            budget=self._budget,
            publisher_factory=self._publisher_factory,
            fencer=self._fencer,
            confirm=ownership.confirm,
            on_progress=self._on_progress,
            on_error=self._on_error,
        )
        side_tasks: list[asyncio.Task[Any]] = []
        if self._checks_departed:
            # Announced before joining, so that a relay killed while its join is pending can be
            # removed for it; and checking while this relay joins, since its join cannot complete
            # while a dead member is in the group (ownership.start() waits for it), and a lone
            # relay's replacement has nobody else to remove its predecessor.
            with contextlib.suppress(Exception):  # the check's own loop reports what fails
                await self.storage.announce_member(self.settings.group_id, ownership.process_key)
            side_tasks.append(
                asyncio.create_task(self._remove_departed(ownership), name="departed")
            )
        try:
            self._counts.update(await ownership.start())
        except BaseException:
            for task in side_tasks:
                task.cancel()
            await _settle(side_tasks)
            await self._fencer.close()
            raise
        stopping = asyncio.create_task(self._stopping.wait(), name="stop")
        try:
            registering = asyncio.create_task(self._register_topics(self._counts))
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
                asyncio.create_task(self._watch(), name="watch"),
            ]
            if self.settings.retention is not None:
                side_tasks.append(asyncio.create_task(self._clean_up(), name="cleanup"))
            done, _ = await asyncio.wait([stopping, *side_tasks], return_when="FIRST_COMPLETED")
            for task in done:
                if task is not stopping:
                    # A side task never ends by itself: its exception stops the relay.
                    task.result()
                    raise RuntimeError(f"relay task {task.get_name()} ended unexpectedly")
        finally:
            self._running = False
            for restart in self._restarts.values():
                restart.cancel()
            self._restarts.clear()
            restarting = list(self._side_tasks)
            for task in [stopping, *side_tasks, *restarting]:
                task.cancel()
            await _settle([*side_tasks, *restarting, stopping])
            await self.revoke(frozenset(self._owned))
            await leave_group(
                ownership.stop(),
                within=self.settings.revoke_timeout + self.settings.session_timeout,
                who=self.settings.group_id,
            )
            with contextlib.suppress(Exception):
                await self._fencer.close()
            logger.info("relay stopped")

    async def _register_topics(self, partitions: dict[str, int]) -> None:
        """Writers need the partition counts: keep trying while the database is away."""
        delay = 0.05
        while True:
            try:
                await self.storage.register_topics(partitions)
                return
            except StorageUnavailableError as exc:
                self._on_error(exc)
                logger.warning("cannot record the topics' partition counts yet", error=repr(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_backoff_max)

    def stop(self) -> None:
        """Ask :meth:`run` to drain and return."""
        self._stopping.set()

    # -- ownership ---------------------------------------------------------------------------

    async def assign(self, partitions: frozenset[TopicPartition]) -> None:
        """Start publishing ``partitions`` (and restart any block whose worker was fenced)."""
        self.metrics.rebalances.inc()
        self._assigned.set()
        if self._ownership is not None:
            # Kafka rebalances when a subscribed topic gains partitions: writers must learn the
            # new count. Best effort; the next rebalance or restart tries again.
            counts = self._ownership.partition_counts()
            self._counts.update(counts)
            try:
                await self.storage.register_topics(counts)
            except Exception as exc:  # never keep the workers below from starting
                logger.warning("could not record the partition counts", error=repr(exc))
        async with self._reconciling:
            self._owned |= partitions
            await self._reconcile()

    async def revoke(self, partitions: frozenset[TopicPartition]) -> None:
        """Stop publishing ``partitions``; wait for their in-flight batch (bounded)."""
        async with self._reconciling:
            self._owned -= partitions
            await self._reconcile()

    async def _reconcile(self) -> None:
        desired = plan(self._owned, self._counts, self.settings.max_block_level)
        wanted = set(desired)
        leaving = [w for block, w in self._workers.items() if block not in wanted]
        for worker in leaving:
            del self._workers[worker.block]
            worker.request_stop()
        await self._drain(leaving)
        for block in desired:
            current = self._workers.get(block)
            if current is not None and current.alive:
                continue
            tps = block.partitions(self._counts.get(block.topic, 0))
            assert self._ctx is not None, "assigned before run()"
            worker = BlockWorker(block, tps, self._ctx)
            worker.task = asyncio.create_task(worker.run(), name=f"block {block}")
            worker.task.add_done_callback(self._on_worker_done)
            self._workers[block] = worker
        self._by_tp = {tp: w for w in self._workers.values() for tp in w.tps}
        self.metrics.owned_partitions.set(len(self._owned))

    async def _drain(self, workers: list[BlockWorker]) -> None:
        tasks = [w.task for w in workers if w.task is not None]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=self.settings.revoke_timeout)
        for task in late:
            logger.warning(
                "partitions did not drain in time, abandoning them", task=task.get_name()
            )
            task.cancel()
        await _settle(tasks)

    def _on_worker_done(self, task: asyncio.Task[None]) -> None:
        """A worker that failed unexpectedly (a bug, or data no handler foresaw) is logged with
        its partitions, shown on the health, and restarted after a backoff that grows with its
        block's consecutive failures: the relay never exits for it, and the other blocks go
        on (G8: never a crash loop, a poison partition blocks only itself)."""
        if task.cancelled() or task.exception() is None or self._stopping.is_set():
            return
        error = task.exception()
        assert error is not None
        worker = next((w for w in self._workers.values() if w.task is task), None)
        if worker is None:
            return
        block = worker.block
        now = time.monotonic()
        failures, last = self._crashes.get(block, (0, now))
        failures = 1 if now - last > _CRASH_MEMORY else failures + 1
        self._crashes[block] = (failures, now)
        delay = min(_CRASH_BACKOFF * 2 ** (failures - 1), _CRASH_BACKOFF_MAX)
        self._last_error = describe(error)
        self.metrics.publish_errors.labels(block.topic, "crashed").inc()
        logger.error(
            "partition worker failed unexpectedly; restarting it",
            block=str(block),
            partitions=[str(tp) for tp in worker.tps],
            failures=failures,
            restart_in=delay,
            exc_info=error,
        )
        restart = asyncio.get_running_loop().call_later(delay, self._restart_soon, block)
        self._restarts[block] = restart

    def _restart_soon(self, block: Block) -> None:
        self._restarts.pop(block, None)
        if not self._stopping.is_set():
            restarted = asyncio.create_task(self._restart(), name=f"restart {block}")
            self._side_tasks.add(restarted)
            restarted.add_done_callback(self._side_tasks.discard)

    async def _restart(self) -> None:
        """Start again every owned block whose worker is not alive (:meth:`_reconcile`)."""
        async with self._reconciling:
            if not self._stopping.is_set():
                await self._reconcile()

    def _on_progress(self) -> None:
        self._last_progress = time.monotonic()

    def _on_error(self, error: BaseException) -> None:
        self._last_error = describe(error)

    # -- health ------------------------------------------------------------------------------

    def health(self) -> RelayHealth:
        since = None if self._last_progress is None else time.monotonic() - self._last_progress
        fenced = {tp for w in self._workers.values() if w.fenced for tp in w.tps}
        return RelayHealth(
            running=self._running,
            owned=sorted(str(tp) for tp in self._owned),
            stalled=sorted(str(tp) for tp in self._stalled if tp in self._owned),
            fenced=sorted(str(tp) for tp in fenced),
            seconds_since_progress=since,
            last_error=self._last_error,
            member_id=self._ownership.member_id if self._ownership is not None else None,
            partitions=self._partition_status(),
            crashed=sorted(
                str(tp)
                for w in self._workers.values()
                if w.block in self._restarts
                for tp in w.tps
                if tp in self._owned
            ),
        )

    def _partition_status(self) -> list[PartitionStatus]:
        now = time.time()
        statuses = []
        for tp in sorted(self._owned, key=lambda t: (t.topic, t.partition)):
            worker = self._by_tp.get(tp)
            backlog = self._backlog.get(tp)
            status = PartitionStatus(str(tp), str(worker.block) if worker else "")
            if self._backlog_at:
                status.pending = backlog.pending if backlog else 0
                status.failed = backlog.failed if backlog else 0
                oldest = backlog.oldest_created_at if backlog else None
                status.oldest_pending_age = (
                    round(max(now - oldest.timestamp(), 0.0), 3) if oldest else 0.0
                )
            if worker is not None:
                status.fenced = worker.fenced
                published = worker.last_publish.get(tp)
                if published is not None:
                    status.last_publish_at = datetime.fromtimestamp(published, UTC).isoformat()
            statuses.append(status)
        return statuses

    # -- side tasks --------------------------------------------------------------------------

    async def _dispatch_wakeups(self) -> None:
        async for tp in self.wakeups.wakeups():
            if tp is None:
                self.metrics.wakeups.labels("reconnect").inc()
                for worker in self._workers.values():
                    worker.wake(None)
            elif (owner := self._by_tp.get(tp)) is not None:
                owner.wake(tp)

    async def _measure_backlog(self) -> None:
        while True:
            with contextlib.suppress(StorageUnavailableError):
                backlog = await self.storage.backlog()
                now = time.time()
                self.metrics.observe_backlog(backlog, now)
                self._backlog = {TopicPartition(b.topic, b.partition): b for b in backlog}
                self._backlog_at = now
                self._stalled = {
                    TopicPartition(b.topic, b.partition)
                    for b in backlog
                    if b.oldest_created_at is not None
                    and now - b.oldest_created_at.timestamp() > self.settings.stall_after
                }
            await asyncio.sleep(self.settings.metrics_interval)

    async def _watch(self) -> None:
        """Say when a stage runs long (which partitions, which stage) and, while publishing
        fails (broker or database unreachable), say so every few seconds with the backlog and
        the time since the last success, instead of one line per retry."""
        slow_logged: dict[Block, float] = {}
        failing_logged = 0.0
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            failing = []
            for block, worker in list(self._workers.items()):
                running = now - worker.stage_since
                if worker.stage is not None and running >= self.settings.slow_after:
                    if now - slow_logged.get(block, 0.0) >= _SLOW_LOG_EVERY:
                        slow_logged[block] = now
                        logger.warning(
                            "relay stage running long",
                            stage=worker.stage,
                            seconds=round(running, 1),
                            partitions=[str(tp) for tp in worker.tps],
                        )
                else:
                    slow_logged.pop(block, None)
                if worker.failing_since is not None and now - worker.failing_since >= 1.0:
                    failing.append(worker)
            if failing and now - failing_logged >= _FAILING_LOG_EVERY:
                failing_logged = now
                tps = [tp for w in failing for tp in w.tps]
                pending = sum(b.pending for tp, b in self._backlog.items() if tp in set(tps))
                since = [now - w.last_success for w in failing if w.last_success is not None]
                logger.warning(
                    "cannot publish",
                    error=failing[0].last_error,
                    partitions=[str(tp) for tp in tps],
                    backlog=pending,
                    seconds_since_success=round(max(since), 1) if since else None,
                    failing_for=round(now - min(w.failing_since or now for w in failing), 1),
                )

    @property
    def _checks_departed(self) -> bool:
        # A static member keeps its place while it restarts: removing it would be the very
        # rebalance static membership avoids.
        return self.settings.departed_check_interval > 0 and self.settings.instance_id is None

    async def _remove_departed(self, ownership: Ownership) -> None:
        """Keep this relay's process announced to the storage, and remove from the group the
        members of every process the storage saw end (:meth:`OutboxStorage.departed_members`):
        Kafka would wait for each until its session timeout, and every rebalance with it, so
        relays that restart faster than that would keep the group rebalancing. The process, not
        the member, is announced: a relay has its process key before it joins, so one killed
        while its join is pending (all of them, after a broker restart) is removed too, and a
        lone relay's replacement removes its predecessor before its own join completes.
        Removing a member that is in fact alive costs it a rejoin, never a guarantee (fencing,
        G4)."""
        group = self.settings.group_id
        key = ownership.process_key
        refused_logged = -_REFUSED_LOG_EVERY
        while True:
            try:
                await self.storage.announce_member(group, key)
                for gone in await self.storage.departed_members(group, key):
                    removed = await ownership.evict_process(gone)
                    if removed:
                        self.metrics.departed_removed.inc(removed)
                        logger.warning(
                            "removed a dead relay from the group: its database connections ended",
                            process=gone,
                            members=removed,
                        )
            except (StorageUnavailableError, KafkaError, OSError) as exc:
                # The session timeout still applies: this only comes sooner.
                logger.info("could not check for dead relays", error=repr(exc))
            except Exception as exc:  # e.g. no privilege on relay_members: never stop the relay
                now = time.monotonic()
                if now - refused_logged >= _REFUSED_LOG_EVERY:
                    refused_logged = now
                    logger.warning(
                        "cannot check for dead relays; they leave the group at their session "
                        "timeout",
                        error=repr(exc),
                    )
            # Again right after an assignment (a rebalance may have been waiting for the dead),
            # else each interval.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.departed_check_interval):
                    await self._assigned.wait()
            self._assigned.clear()

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
