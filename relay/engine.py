"""The relay engine: owned partitions → blocks → one publishing loop per block. Storage-agnostic.

:class:`Relay` composes the parts a relay runs on: it joins the relay's consumer group
(:mod:`outboxkit.relay.ownership`); the :class:`~outboxkit.relay.reconciler.PartitionReconciler`
keeps one :class:`~outboxkit.relay.worker.BlockWorker` (one transactional producer) per block of
the partitions it owns as they come and go; side tasks (:mod:`outboxkit.relay.side_tasks`,
:mod:`outboxkit.relay.departed`) route wake-ups, measure the backlog, watch for slow stages and
failures, purge, evict departed relays, take the relay out of its group while it cannot read
its database and step it aside from partitions it holds but cannot publish
(:mod:`outboxkit.relay.stuck`), supervised by :class:`~outboxkit.core.supervisor.Supervisor`:
if one dies, the relay stops loudly instead of running half-blind. Its health is
:mod:`outboxkit.relay.health`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

import structlog

from outboxkit.core.kafka import leave_group
from outboxkit.core.step_aside import StepAside
from outboxkit.core.supervisor import Supervisor
from outboxkit.core.waiting import sleep_unless_cancelled, unless_stopped
from outboxkit.relay.batches import InFlightLimit
from outboxkit.relay.blocks import Block
from outboxkit.relay.degraded import MissedWakeups
from outboxkit.relay.departed import DepartedCheck
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.fencing import Fencer, KafkaFencer
from outboxkit.relay.health import PartitionStatus, Progress, RelayHealth, partition_statuses
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.ownership import KafkaOwnership, PartitionsCallback
from outboxkit.relay.publisher import KafkaPublisher, PublisherFactory
from outboxkit.relay.reconciler import CrashBackoff, PartitionReconciler
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.side_tasks import BacklogMonitor, StageWatch, clean_up, dispatch_wakeups
from outboxkit.relay.storage import OutboxStorage, WakeupSource
from outboxkit.relay.stuck import StuckBlocks
from outboxkit.relay.worker import BlockWorker, WorkerContext

logger = structlog.get_logger("outboxkit.relay")

__all__ = ["Ownership", "PartitionStatus", "Relay", "RelayHealth"]


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

    def lapsed(self) -> float | None:
        """Seconds the group coordinator has not answered this member, once the group has
        surely dropped it (it then publishes nothing until a new assignment); else None."""

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

    async def step_aside(self) -> None:
        """Leave the group and publish nothing until :meth:`step_in` (this relay cannot read
        its database)."""

    async def step_aside_from(self, partitions: frozenset[TopicPartition]) -> None:
        """Rejoin the group asking not to be given ``partitions`` (this relay could not
        publish them), until :meth:`avoid_nothing`."""

    def avoid_nothing(self) -> None:
        """Ask for no partition to be kept from this relay any more (from its next join)."""

    def step_in(self) -> None:
        """Join the group again after :meth:`step_aside`."""

    async def stop(self) -> None:
        """Leave (revocation drains first)."""


OwnershipFactory = Callable[[RelaySettings, PartitionsCallback, PartitionsCallback], Ownership]
FencerFactory = Callable[[RelaySettings], Fencer]


def _kafka_ownership(
    settings: RelaySettings, on_assigned: PartitionsCallback, on_revoked: PartitionsCallback
) -> Ownership:
    return KafkaOwnership(settings, on_assigned=on_assigned, on_revoked=on_revoked)


class Relay:
    """Publishes the outbox of ``storage`` to Kafka for the partitions this instance owns,
    woken by ``wakeups`` when writers commit.

    ``await relay.run()`` runs until :meth:`stop` (e.g. on SIGTERM): it then stops claiming,
    lets in-flight batches finish, leaves the consumer group and returns.

    The factories and ``crash_backoff`` (how a block's worker that failed unexpectedly is
    restarted) default to production's; tests pass their own."""

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
        crash_backoff: CrashBackoff | None = None,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.wakeups = wakeups
        self.metrics = metrics or RelayMetrics()
        self._publisher_factory = publisher_factory or (lambda b: KafkaPublisher(b, settings))
        self._ownership_factory = ownership_factory
        self._fencer_factory = fencer_factory
        self._budget = InFlightLimit(settings.max_in_flight, self.metrics)
        self._progress = Progress()
        self._partitions = PartitionReconciler(
            settings, self.metrics, self._new_worker, self._progress.failed, crash_backoff
        )
        self._backlog = BacklogMonitor(storage, settings, self.metrics)
        self._missed_wakeups = MissedWakeups(self.metrics)
        self._stopping = asyncio.Event()
        self._running = False
        self._ownership: Ownership | None = None
        self._departed: DepartedCheck | None = None
        self._step_aside: StepAside | None = None
        self._stuck: StuckBlocks | None = None
        self._ctx: WorkerContext | None = None

    async def run(self) -> None:
        ownership = self._ownership = self._ownership_factory(
            self.settings, self.assign, self.revoke
        )
        fencer = self._fencer_factory(self.settings)
        self._ctx = WorkerContext(
            settings=self.settings,
            storage=self.storage,
            wakeups=self.wakeups,
            metrics=self.metrics,
            budget=self._budget,
            publisher_factory=self._publisher_factory,
            fencer=fencer,
            confirm=ownership.confirm,
            on_progress=self._progress.progressed,
            on_error=self._progress.failed,
            missed_wakeups=self._missed_wakeups,
        )
        tasks = Supervisor("relay")
        if DepartedCheck.wanted(self.settings):
            # Announced before joining, so that a relay killed while its join is pending can be
            # removed for it; and checking while this relay joins, since its join cannot complete
            # while a dead member is in the group (ownership.start() waits for it), and a lone
            # relay's replacement has nobody else to remove its predecessor.
            self._departed = DepartedCheck(self.settings, self.storage, ownership, self.metrics)
            await self._departed.announce()
            tasks.start("departed", self._departed.run())
        try:
            self._partitions.counts.update(await ownership.start())
        except BaseException:
            await tasks.cancel()
            await fencer.close()
            raise
        try:
            if not await unless_stopped(self._stopping, self._register_topics()):
                return  # stopped while the database is away
            self._running = True
            tasks.start("ownership", ownership.run())
            tasks.start("wakeups", dispatch_wakeups(self.wakeups, self._partitions, self.metrics))
            tasks.start("metrics", self._backlog.run())
            tasks.start("watch", StageWatch(self._partitions, self._backlog, self.settings).run())
            if self.settings.retention is not None:
                tasks.start("cleanup", clean_up(self.storage, self.settings))
            if self.settings.step_aside_after > 0:
                self._stuck = StuckBlocks(
                    self._partitions,
                    lambda: self._backlog.backlog,
                    ownership,
                    self.settings,
                    self.metrics,
                )
                tasks.start("stuck", self._stuck.run())
                self._step_aside = StepAside(
                    self._backlog.unanswered_for,
                    ownership,
                    self.settings.step_aside_after,
                    others="the other relays publish this relay's partitions",
                    gauge=self.metrics.stepped_aside.set,
                    log=logger,
                    since_progress=lambda: self._progress.seconds_since_progress,
                )
                tasks.start("step-aside", self._step_aside.run())
            await tasks.wait(self._stopping)
        finally:
            self._running = False
            self._partitions.halt()
            await tasks.cancel()
            await self._partitions.close()
            await leave_group(
                ownership.stop(),
                within=self.settings.revoke_timeout + self.settings.session_timeout,
                who=self.settings.group_id,
            )
            with contextlib.suppress(Exception):
                await fencer.close()
            logger.info("relay stopped")

    def stop(self) -> None:
        """Ask :meth:`run` to drain and return."""
        self._stopping.set()
        self._partitions.halt()

    async def assign(self, partitions: frozenset[TopicPartition]) -> None:
        """Start publishing ``partitions`` (and restart any block whose worker was fenced)."""
        self.metrics.rebalances.inc()
        if self._departed is not None:
            self._departed.assigned()
        if self._ownership is not None:
            # Kafka rebalances when a subscribed topic gains partitions: writers must learn the
            # new count. Best effort; the next rebalance or restart tries again. Not bounded
            # below the session timeout, on purpose: aiokafka sends no heartbeat until this
            # callback returns, so a relay whose database does not answer (connection refused,
            # or silent for OUTBOXKIT_DATABASE_TIMEOUT) loses its membership again each time it
            # rejoins, and the relays that reach the database publish its partitions.
            counts = self._ownership.partition_counts()
            self._partitions.counts.update(counts)
            try:
                await self.storage.register_topics(counts)
            except Exception as exc:  # never keep the workers below from starting
                logger.warning("could not record the partition counts", error=repr(exc))
        await self._partitions.assign(partitions)

    async def revoke(self, partitions: frozenset[TopicPartition]) -> None:
        """Stop publishing ``partitions``; wait for their in-flight batch (bounded)."""
        await self._partitions.revoke(partitions)

    def health(self) -> RelayHealth:
        owned = self._partitions.owned
        workers = self._partitions.workers
        return RelayHealth(
            running=self._running,
            owned=sorted(str(tp) for tp in owned),
            stalled=sorted(str(tp) for tp in self._backlog.stalled if tp in owned),
            fenced=sorted(str(tp) for w in workers if w.fenced for tp in w.tps),
            seconds_since_progress=self._progress.seconds_since_progress,
            last_error=self._progress.last_error,
            member_id=self._ownership.member_id if self._ownership is not None else None,
            partitions=partition_statuses(owned, self._partitions.worker_of, self._backlog.backlog),
            crashed=sorted(str(tp) for tp in self._partitions.crashed),
            membership_lapsed_for=(
                None if self._ownership is None else _rounded(self._ownership.lapsed())
            ),
            database_unreadable_for=_rounded(self._backlog.unreadable_for()),
            stepped_aside_for=(
                None if self._step_aside is None else _rounded(self._step_aside.aside_for())
            ),
            wakeups_missed_for=_rounded(self._missed_wakeups.missed_for()),
            stuck=[] if self._stuck is None else sorted(str(tp) for tp in self._stuck.showing()),
        )

    def _new_worker(self, block: Block, tps: list[TopicPartition]) -> BlockWorker:
        assert self._ctx is not None, "assigned before run()"
        return BlockWorker(block, tps, self._ctx)

    async def _register_topics(self) -> None:
        """Writers need the partition counts: keep trying while the database is away."""
        delay = 0.05
        while True:
            try:
                await self.storage.register_topics(self._partitions.counts)
                return
            except StorageUnavailableError as exc:
                self._progress.failed(exc)
                logger.warning("cannot record the topics' partition counts yet", error=repr(exc))
                await sleep_unless_cancelled(delay)
                delay = min(delay * 2, self.settings.retry_backoff_max)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
