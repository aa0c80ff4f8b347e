"""One block's publishing loop (the block: :mod:`outboxkit.relay.blocks`).

    cycle:
        settle the last batch, read the heads of the partitions   (storage.settle_and_claim, 1 call)
        up to claim_depth records per key, as batches by depth    (by_depth)
        for each batch: one record per key                        (per-key barrier, G2)
            settle the batch before (from the second on)          (settle_and_claim, settle only)
            publish it: one Kafka transaction                     (publisher.publish)

Settling a batch (deleting it, or marking it published) shares the next cycle's statement: it
is durable before that statement returns, so before any later record of its keys is sent. A
batch never holds two records of one key, so a crash between Kafka's commit and the settle can
only repeat the latest record of a key (``R0 R1 R1 R2``), never put an older one after a newer
one. Nothing is claimed in the database: a stale relay is fenced by Kafka.

:class:`BlockWorker` is the cycle; its parts each have one job:

- :class:`~outboxkit.relay.gate.IdleGate`: which partitions to read, idle or busy, the wait for
  a wake-up or the sweep;
- :class:`~outboxkit.relay.lease.ProducerLease`: the block's producer (confirm, fence, init,
  confirm; dropped after a Kafka error; regained after a fence);
- :class:`~outboxkit.relay.settler.Settler`: what the outbox learns of each batch (settled,
  refused, parked);
- :class:`~outboxkit.relay.clock.StageClock`: the time of each stage, and the cycle's pace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from outboxkit.relay.batches import InFlightLimit, by_depth
from outboxkit.relay.blocks import Block
from outboxkit.relay.clock import StageClock
from outboxkit.relay.degraded import MissedWakeups
from outboxkit.relay.exceptions import OwnershipLostError
from outboxkit.relay.fencing import Fencer
from outboxkit.relay.gate import IdleGate
from outboxkit.relay.lease import Confirm, ProducerLease
from outboxkit.relay.limits import record_bytes
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.publisher import PublisherFactory, describe
from outboxkit.relay.records import OutboxRecord, TopicPartition
from outboxkit.relay.retry import RETRIABLE, RetryLater, retrying
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.settler import Settler
from outboxkit.relay.storage import OutboxStorage, WakeupSource

logger = structlog.get_logger("outboxkit.relay")


@dataclass
class WorkerContext:
    """What a block worker shares with its relay."""

    settings: RelaySettings
    storage: OutboxStorage
    wakeups: WakeupSource
    metrics: RelayMetrics
    budget: InFlightLimit
    publisher_factory: PublisherFactory
    fencer: Fencer
    confirm: Confirm
    on_progress: Callable[[], None]
    on_error: Callable[[BaseException], None]
    #: Wake-ups the relay's blocks missed (:mod:`outboxkit.relay.degraded`).
    missed_wakeups: MissedWakeups


@dataclass
class BlockWorker:
    """One block's cycle, run until stopped; retriable errors backed off, a fence waited out."""

    block: Block
    tps: list[TopicPartition]
    ctx: WorkerContext
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    fenced: bool = False
    #: Per partition, when a record of it was last acknowledged by Kafka (epoch seconds).
    last_publish: dict[TopicPartition, float] = field(default_factory=dict)
    last_success: float | None = None
    failing_since: float | None = None
    last_error: str | None = None
    #: When this worker was made (monotonic): what "no progress since" counts from before its
    #: first publish.
    started_at: float = field(default_factory=time.monotonic)
    #: The last claim found more than one batch can carry: the next cycle starts at once.
    _backlog: bool = False
    #: The next publish sends one record per record batch (after a refused record batch).
    _alone: bool = False

    def __post_init__(self) -> None:
        ctx, settings = self.ctx, self.ctx.settings
        clock = self.clock = StageClock(ctx.metrics, self.tps, settings, self.stop)
        self.gate = IdleGate(
            self.tps, ctx.wakeups, ctx.metrics, settings, self.stop, ctx.missed_wakeups
        )
        self.lease = ProducerLease(
            self.block, self.tps, settings, ctx.confirm, ctx.fencer, ctx.publisher_factory, clock
        )
        self.settler = Settler(ctx.storage, settings, ctx.metrics, clock)
        # The hot path's metric children, looked up once (labels() takes a lock each time).
        topic = self.block.topic
        self._batches = ctx.metrics.batches.labels(topic)
        self._published = ctx.metrics.published.labels(topic)
        self._latency = ctx.metrics.latency.labels(topic)

    def __str__(self) -> str:
        return str(self.block)

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    @property
    def stage(self) -> str | None:
        """The stage running now (for the relay's watch on stages that run long)."""
        return self.clock.current

    @property
    def stage_since(self) -> float:
        """When :attr:`stage` began (monotonic)."""
        return self.clock.since

    def wake(self, tp: TopicPartition | None) -> None:
        """A writer committed rows of ``tp`` (``None``: maybe any partition)."""
        self.gate.wake(tp)

    def reconnected(self) -> None:
        """The wake-ups reconnected: read everything, declare the block waiting again."""
        self.gate.reconnected()

    def request_stop(self) -> None:
        self.stop.set()
        self.gate.interrupt()

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        log = logger.bind(block=str(self.block))
        try:
            while not self.stop.is_set():
                try:
                    await self._steps(log)
                except OwnershipLostError as exc:
                    await self.lease.drop()
                    if self.stop.is_set():
                        log.info("block fenced while stopping", error=str(exc))
                        return
                    self.fenced = True
                    self.ctx.metrics.publish_errors.labels(self.block.topic, "fenced").inc()
                    # Kafka answers a transaction it aborted for its timeout (a send held up by a
                    # leader election, say) as it answers a newer producer: ProducerFenced.
                    log.warning(
                        "partitions fenced: another relay publishes them now, or a transaction "
                        "outlived OUTBOXKIT_TRANSACTION_TIMEOUT",
                        partitions=[str(tp) for tp in self.tps],
                        error=str(exc),
                    )
                    if await self.lease.regain(self.stop):
                        self.fenced = False
                        self.gate.look_again()
        finally:
            await self._finish(log)

    async def _steps(self, log: structlog.typing.FilteringBoundLogger) -> None:
        """Cycle until stopped; a retriable error is retried with backoff (tenacity)."""
        while not self.stop.is_set():
            try:
                await self._step(log)
                continue
            except OwnershipLostError:
                raise
            except RETRIABLE as exc:
                failure: BaseException | None = exc
            async for attempt in retrying(self.ctx.settings, log, self.stop, self._failed):
                with attempt:
                    if failure is not None:  # the first attempt is the one that just failed
                        error, failure = failure, None
                        raise error
                    if self.stop.is_set():
                        return
                    await self._step(log)

    def _failed(self, error: BaseException) -> None:
        self.last_error = describe(error)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.ctx.on_error(error)

    async def _step(self, log: structlog.typing.FilteringBoundLogger) -> None:
        if not self.gate.due and not self.settler.unsettled:
            await self.gate.rest()
            return
        await self.lease.acquire(log)
        await self._cycle(log)
        self.failing_since = None

    # -- one cycle --------------------------------------------------------------------------

    async def _cycle(self, log: structlog.typing.FilteringBoundLogger) -> None:
        settings = self.ctx.settings
        await self.clock.pace(backlog=self._backlog)
        look, woken_at = self.gate.take()
        self.clock.begin_cycle(woken_at)
        limit = settings.batch_size
        share = max(1, settings.max_claim_bytes // max(1, len(look)))
        try:
            records = await self.settler.settle_and_claim(look, limit, max_bytes=share)
        except BaseException:
            self.gate.look_again(look)
            raise
        ranks = by_depth(records)
        full = _full(ranks, records, limit, share)
        self._backlog = bool(full) or len(ranks) > 1
        self.gate.look_again(full)
        for depth, batch in enumerate(ranks):
            if depth:
                # The last batch is in Kafka: settle it, durably, before its keys' next records
                # go out (G2). Anything short of the whole batch (budget, rejections, a refused
                # record batch) leaves the next records to the next claim.
                if self.stop.is_set() or self.settler.unsettled != len(ranks[depth - 1]):
                    break
                await self.settler.settle()
            await self._publish(batch, log)
        await self.gate.after_cycle(bool(ranks))

    async def _publish(
        self, batch: list[OutboxRecord], log: structlog.typing.FilteringBoundLogger
    ) -> None:
        ctx = self.ctx
        # Whatever happens, look at these partitions again: their keys' next records after a
        # success, the same records after a failure.
        self.gate.look_again(_partitions(batch))
        granted = await ctx.budget.take(len(batch))
        batch = batch[:granted]  # the rest waits for the next cycle
        publisher = self.lease.publisher
        assert publisher is not None
        try:
            with self.clock.publishing() as times:
                try:
                    async with asyncio.timeout(ctx.settings.publish_timeout):
                        outcome = await publisher.publish(batch, times, alone=self._alone)
                except OwnershipLostError:
                    raise
                except Exception:
                    ctx.metrics.publish_errors.labels(self.block.topic, "retriable").inc()
                    await self.lease.drop()
                    raise
        finally:
            await ctx.budget.give(granted)
        # Kafka has them: the next cycle's statement settles them, then their keys move on.
        self.settler.accepted(outcome.published)
        # A refused record batch: the next attempt sends one record per record batch, to learn
        # which record it was. After any refusal the producer's sequence numbers are off.
        self._alone = outcome.refused_batch
        if outcome.refused_batch or outcome.rejected:
            await self.lease.drop()
        if outcome.published:
            self._observe(outcome.published)
        if outcome.rejected and not await self.settler.refused(outcome.rejected, log):
            raise RetryLater(_refusal(outcome.rejected))

    def _observe(self, published: Sequence[OutboxRecord]) -> None:
        """Acknowledged by Kafka: count them and their insert → acknowledgement latency."""
        now = time.time()
        self.last_success = time.monotonic()
        self._batches.inc()
        self._published.inc(len(published))
        for tp in _partitions(published):
            self.last_publish[tp] = now
        observe = self._latency.observe
        for record in published:
            if record.created_at is not None:
                observe(max(now - record.created_at.timestamp(), 0.0))
        self.ctx.on_progress()

    async def _finish(self, log: structlog.typing.FilteringBoundLogger) -> None:
        """Stopping: settle what Kafka accepted (else the next owner publishes it again), stop
        being woken, close the producer."""
        if self.settler.unsettled:
            try:
                async with asyncio.timeout(self.ctx.settings.revoke_timeout):
                    await self.settler.settle()
            except Exception as exc:  # published anyway; the next owner repeats them (G2 allows)
                log.warning("could not settle the last batch", error=repr(exc))
        await self.gate.leave()
        await self.lease.drop()


def _partitions(records: Sequence[OutboxRecord]) -> set[TopicPartition]:
    """The partitions of ``records`` (one object per partition, not per record)."""
    return {TopicPartition(t, p) for t, p in {(r.topic, r.partition) for r in records}}


def _full(
    ranks: list[list[OutboxRecord]], records: list[OutboxRecord], limit: int, share: int
) -> set[TopicPartition]:
    """The partitions the storage may have more of than this claim returned: ``limit`` keys
    in the first batch, or records that reached their ``share`` of ``max_claim_bytes`` (the
    storage stops once the bytes before a record reach it)."""
    counts: dict[TopicPartition, int] = {}
    for record in ranks[0] if ranks else ():
        tp = TopicPartition(record.topic, record.partition)
        counts[tp] = counts.get(tp, 0) + 1
    size: dict[TopicPartition, int] = {}
    for record in records:
        tp = TopicPartition(record.topic, record.partition)
        size[tp] = size.get(tp, 0) + record_bytes(record)
    return {tp for tp, n in counts.items() if n >= limit} | {
        tp for tp, n in size.items() if n >= share
    }


def _refusal(rejected: Sequence[tuple[OutboxRecord, str]]) -> str:
    """Why a batch is tried again: the first record Kafka refused, and Kafka's words."""
    record, error = rejected[0]
    more = f" and {len(rejected) - 1} more" if len(rejected) > 1 else ""
    return (
        f"Kafka refused event {record.event_id} of {record.topic}/{record.partition}{more}: {error}"
    )
