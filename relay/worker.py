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

Batches are sized by time: a cycle starts at most every ``batch_interval`` unless the last one
found a full batch (a backlog), so under load a transaction carries what was committed
meanwhile, and an idle relay sends at once. The worker is *idle* (it has declared itself
waiting, writers wake it with NOTIFY) or *busy* (it reads every partition of its block each
cycle and writers notify nobody): a busy relay costs writers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from outboxkit.relay.batches import InFlightBudget, by_depth
from outboxkit.relay.blocks import Block, fence_ids
from outboxkit.relay.exceptions import OwnershipLostError, StorageUnavailableError
from outboxkit.relay.fencing import Fencer
from outboxkit.relay.limits import record_bytes
from outboxkit.relay.metrics import STAGES, RelayMetrics
from outboxkit.relay.publisher import Publisher, PublisherFactory, StageTimes, describe
from outboxkit.relay.records import OutboxRecord, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage, WakeupSource

logger = structlog.get_logger("outboxkit.relay")

#: Going idle, a relay waits (polling with backoff, at most this long) until every writer
#: transaction open at its declaration has ended, then looks once more (see _await_writers).
WRITERS_WAIT_MAX = 1.0

#: An idle (waiting) block turns busy after this many cycles in a row that found records (it
#: is never left waiting: writers need not notify it); a busy block turns idle after this many
#: empty cycles in a row.
BUSY_AFTER = 8
IDLE_AFTER = 3

#: After being fenced, a worker confirms its membership at this pace before starting again.
FENCED_RECHECK = 1.0


class _RetryLater(Exception):
    """Records were rejected: back off before their next attempt."""


class NotConfirmedError(_RetryLater):
    """The group did not confirm this relay's membership: no producer may start yet."""


RETRIABLE = (StorageUnavailableError, KafkaError, OSError, _RetryLater)


class Confirm(Protocol):
    def __call__(self, partitions: frozenset[TopicPartition]) -> Awaitable[bool]: ...


@dataclass
class WorkerContext:
    """What a block worker shares with its relay."""

    settings: RelaySettings
    storage: OutboxStorage
    wakeups: WakeupSource
    metrics: RelayMetrics
    budget: InFlightBudget
    publisher_factory: PublisherFactory
    fencer: Fencer
    confirm: Confirm
    on_progress: Callable[[], None]
    on_error: Callable[[BaseException], None]


@dataclass
class BlockWorker:
    block: Block
    tps: list[TopicPartition]
    ctx: WorkerContext
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    publisher: Publisher | None = None
    fenced: bool = False
    #: Per partition, when a record of it was last acknowledged by Kafka (epoch seconds).
    last_publish: dict[TopicPartition, float] = field(default_factory=dict)
    last_success: float | None = None
    failing_since: float | None = None
    last_error: str | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _dirty: set[TopicPartition] = field(default_factory=set)
    _finished: list[OutboxRecord] = field(default_factory=list)
    _waiting: bool = False
    _streak: int = 0
    _empty: int = 0
    _backlog: bool = False
    _woken_at: float | None = None
    _cycle_started: float = 0.0
    _stage_name: str | None = None
    _stage_since: float = 0.0
    _publishing: StageTimes | None = None
    _alone: bool = False

    def __post_init__(self) -> None:
        self._dirty = set(self.tps)  # look at everything first
        # The hot path's metric children, looked up once (labels() takes a lock each time).
        metrics, topic = self.ctx.metrics, self.block.topic
        self._stages = {name: metrics.stage.labels(name) for name in STAGES}
        self._batches = metrics.batches.labels(topic)
        self._published = metrics.published.labels(topic)
        self._latency = metrics.latency.labels(topic)

    def __str__(self) -> str:
        return str(self.block)

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    @property
    def waiting(self) -> bool:
        return self._waiting

    @property
    def stage(self) -> str | None:
        """The stage running now (for the relay's watch on stages that run long)."""
        if self._publishing is not None:
            return self._publishing.current
        return self._stage_name

    @property
    def stage_since(self) -> float:
        """When :attr:`stage` began (monotonic)."""
        if self._publishing is not None:
            return self._publishing.since
        return self._stage_since

    def wake(self, tp: TopicPartition | None) -> None:
        """A writer committed rows of ``tp`` (``None``: maybe any partition)."""
        self._dirty.update(self.tps if tp is None else (tp,))
        if self._woken_at is None:
            self._woken_at = time.perf_counter()
        self._wake.set()

    def request_stop(self) -> None:
        self.stop.set()
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        log = logger.bind(block=str(self.block))
        try:
            while not self.stop.is_set():
                try:
                    await self._steps(log)
                except OwnershipLostError as exc:
                    await self._drop_publisher()
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
                    await self._wait_until_confirmed()
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

    async def _wait_until_confirmed(self) -> None:
        """Fenced: either the group moves this block's partitions (the relay stops this worker)
        or it confirms they are still ours (a fence raced a rebalance), and then start again."""
        while not self.stop.is_set():
            await self._sleep(FENCED_RECHECK)
            if self.stop.is_set():
                return
            with contextlib.suppress(*RETRIABLE):
                if await self.ctx.confirm(frozenset(self.tps)):
                    self.fenced = False
                    self._dirty = set(self.tps)
                    return

    async def _step(self, log: structlog.typing.FilteringBoundLogger) -> None:
        if not self._dirty and not self._finished:
            await self._idle()
            return
        await self._ensure_publisher(log)
        await self._cycle(log)
        self.failing_since = None

    # -- idle and busy ----------------------------------------------------------------------

    async def _idle(self) -> None:
        if not self._waiting:
            # Declare idle, then look once more when the writers that may have missed the
            # declaration are done: they sent no notification.
            self._waiting = await self._set_waiting(True)
            self._streak = 0
            await self._await_writers()
            self._dirty = set(self.tps)
            return
        reason = await self._wait(self.ctx.settings.sweep_interval)
        if reason == "sweep":
            self._dirty = set(self.tps)
        self.ctx.metrics.wakeups.labels(reason).inc()

    async def _set_waiting(self, waiting: bool) -> bool:
        try:
            await self.ctx.wakeups.set_waiting(self.tps, waiting)
        except StorageUnavailableError:
            return False  # no wake-ups then: the sweep still runs
        return waiting

    async def _await_writers(self) -> None:
        """Until every writer transaction that was open when the block was declared idle has
        ended (its trigger may have run before the declaration was visible, so it sent no
        wake-up; its row is visible afterwards), a wake-up arrives, or a bound passes (a long
        transaction elsewhere on the server holds the horizon back: the sweep covers it)."""
        delay, deadline = 0.002, time.monotonic() + WRITERS_WAIT_MAX
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                if await self.ctx.wakeups.writers_settled(self.tps):
                    return
            except StorageUnavailableError:
                return  # the next read fails too and is retried
            if await self._wait(delay) == "notify":
                return
            delay = min(delay * 2, 0.1)

    async def _sleep(self, seconds: float) -> None:
        """``seconds``, or until stopped."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stop.wait()

    async def _wait(self, seconds: float) -> str:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
                return "notify"
        return "sweep"

    async def _after_cycle(self, found: bool) -> None:
        """Switch between idle (declared, woken by writers) and busy (reading every cycle)."""
        if self._waiting:
            self._streak = self._streak + 1 if found else 0
            if self._streak >= BUSY_AFTER:
                try:
                    await self.ctx.wakeups.set_waiting(self.tps, False)
                except StorageUnavailableError:
                    return
                self._waiting, self._empty = False, 0
        elif found:
            self._empty = 0
        else:
            self._empty += 1
            if self._empty < IDLE_AFTER:
                self._dirty.update(self.tps)  # poll again, paced

    # -- one cycle --------------------------------------------------------------------------

    async def _pace(self) -> None:
        if self._backlog:
            return
        delay = self._cycle_started + self.ctx.settings.batch_interval - time.perf_counter()
        if delay > 0:
            with self._stage("pace"):
                await self._sleep(delay)

    async def _cycle(self, log: structlog.typing.FilteringBoundLogger) -> None:
        ctx = self.ctx
        await self._pace()
        self._cycle_started = time.perf_counter()
        if self._woken_at is not None:
            self._stages["wakeup"].observe(self._cycle_started - self._woken_at)
            self._woken_at = None
        look = self._dirty if self._waiting else set(self.tps)
        finished = self._finished
        self._dirty, self._finished = set(), []
        self._wake.clear()
        limit = ctx.settings.batch_size
        share = max(1, ctx.settings.max_claim_bytes // max(1, len(look)))
        try:
            with self._stage("claim"):
                records = await ctx.storage.settle_and_claim(
                    look,
                    limit,
                    published=finished,
                    keep=ctx.settings.retention is not None,
                    depth=ctx.settings.claim_depth,
                    max_bytes=share,
                )
        except BaseException:
            # Maybe not settled: settling twice is harmless, not settling is not.
            self._finished = finished + self._finished
            self._dirty |= look
            raise
        ranks = by_depth(records)
        counts: dict[TopicPartition, int] = {}
        for record in ranks[0] if ranks else ():
            tp = TopicPartition(record.topic, record.partition)
            counts[tp] = counts.get(tp, 0) + 1
        full = {tp for tp, n in counts.items() if n >= limit} | _cut_by_bytes(records, share)
        self._backlog = bool(full) or len(ranks) > 1
        self._dirty |= full
        for depth, batch in enumerate(ranks):
            if depth:
                # The last batch is in Kafka: settle it, durably, before its keys' next records
                # go out (G2). Anything short of the whole batch (budget, rejections, a refused
                # record batch) leaves the next records to the next claim.
                if self.stop.is_set() or len(self._finished) != len(ranks[depth - 1]):
                    break
                await self._settle()
            await self._publish(batch, log)
        await self._after_cycle(bool(ranks))

    async def _settle(self) -> None:
        """Settle what Kafka accepted, without reading (the claim usually does it on its way)."""
        finished, self._finished = self._finished, []
        try:
            with self._stage("settle"):
                await self.ctx.storage.settle_and_claim(
                    (), 1, published=finished, keep=self.ctx.settings.retention is not None
                )
        except BaseException:
            self._finished = finished + self._finished
            raise

    async def _publish(
        self, batch: list[OutboxRecord], log: structlog.typing.FilteringBoundLogger
    ) -> None:
        ctx = self.ctx
        # Whatever happens, look at these partitions again: their keys' next records after a
        # success, the same records after a failure.
        self._dirty.update(_partitions(batch))
        granted = await ctx.budget.take(len(batch))
        batch = batch[:granted]  # the rest waits for the next cycle
        publisher = self.publisher
        assert publisher is not None
        times = self._publishing = StageTimes()
        try:
            try:
                async with asyncio.timeout(ctx.settings.publish_timeout):
                    outcome = await publisher.publish(batch, times, alone=self._alone)
            except OwnershipLostError:
                raise
            except Exception:
                ctx.metrics.publish_errors.labels(self.block.topic, "retriable").inc()
                await self._drop_publisher()
                raise
            finally:
                self._publishing = None
                if times.current == "send":  # failed or timed out while sending
                    times.send = time.monotonic() - times.since
                self._record_stage("send", times.send)
                if times.current == "commit":
                    self._record_stage("commit", times.commit or time.monotonic() - times.since)
        finally:
            await ctx.budget.give(granted)
        # Kafka has them: the next cycle's statement settles them, then their keys move on.
        self._finished = outcome.published
        # A refused record batch: the next attempt sends one record per record batch, to learn
        # which record it was. After any refusal the producer's sequence numbers are off.
        self._alone = outcome.refused_batch
        if outcome.refused_batch or outcome.rejected:
            await self._drop_publisher()
        if outcome.published:
            self._observe(outcome.published)
        give_up_any = False
        for record, error in outcome.rejected:
            give_up = record.attempts + 1 >= ctx.settings.max_attempts
            give_up_any |= give_up
            await ctx.storage.record_failure(record, error, give_up=give_up)
            ctx.metrics.publish_errors.labels(record.topic, "rejected").inc()
            if give_up:
                ctx.metrics.parked.labels(record.topic).inc()
            log.error(
                "record parked as failed" if give_up else "record rejected by Kafka",
                event_id=str(record.event_id),
                partition=f"{record.topic}/{record.partition}",
                attempts=record.attempts + 1,
                error=error,
            )
        if outcome.rejected and not give_up_any:
            raise _RetryLater

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

    # -- stages -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        self._stage_name, self._stage_since = name, time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - self._stage_since
            self._stage_name = None
            self._record_stage(name, took)

    def _record_stage(self, name: str, seconds: float) -> None:
        self._stages[name].observe(seconds)
        if seconds >= self.ctx.settings.slow_after and name != "pace":
            logger.warning(
                "slow relay stage",
                stage=name,
                seconds=round(seconds, 3),
                partitions=[str(tp) for tp in self.tps],
            )

    # -- the producer -----------------------------------------------------------------------

    async def _ensure_publisher(self, log: structlog.typing.FilteringBoundLogger) -> None:
        if self.publisher is not None:
            return
        ctx = self.ctx
        settings = ctx.settings
        own = frozenset(self.tps)
        if settings.transactional:
            # Only a member of the current generation that still owns the whole block may
            # initialise producers: a zombie's init could fence the rightful owner, or run beside
            # it under another block's id.
            with self._stage("confirm"):
                if not await ctx.confirm(own):
                    raise NotConfirmedError(f"{self.block}: membership not confirmed")
            others = fence_ids(settings.group_id, self.tps) - {
                self.block.transactional_id(settings.group_id)
            }
            with self._stage("fence"):
                async with asyncio.timeout(settings.publish_timeout):
                    await ctx.fencer.fence(others)
        publisher = ctx.publisher_factory(self.block)
        try:
            with self._stage("init"):
                async with asyncio.timeout(settings.publish_timeout):
                    await publisher.start()  # fences earlier users of the block's own id
            if settings.transactional:
                # Once more, now that the producer exists: a rebalance that gave a partition to
                # another relay between the first confirmation and this init would let both
                # publish. Confirmed now, the group is still at this generation, so whoever gets
                # these partitions next initialises after this producer and fences it.
                with self._stage("confirm"):
                    if not await ctx.confirm(own):
                        raise NotConfirmedError(f"{self.block}: membership not confirmed")
        except BaseException:
            with contextlib.suppress(Exception):
                await publisher.close()
            raise
        self.publisher = publisher
        log.debug("producer started", transactional=settings.transactional)

    async def _drop_publisher(self) -> None:
        """After a Kafka error the producer may be in any state: the next attempt starts a
        fresh one (which, with transactions, also aborts whatever this one left open)."""
        if self.publisher is not None:
            publisher, self.publisher = self.publisher, None
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.ctx.settings.publish_timeout):
                    await publisher.close()

    async def _finish(self, log: structlog.typing.FilteringBoundLogger) -> None:
        """Stopping: settle what Kafka accepted (else the next owner publishes it again), stop
        being woken, close the producer."""
        ctx = self.ctx
        if self._finished:
            try:
                async with asyncio.timeout(ctx.settings.revoke_timeout):
                    await self._settle()
            except Exception as exc:  # published anyway; the next owner repeats them (G2 allows)
                log.warning("could not settle the last batch", error=repr(exc))
        if self._waiting:
            with contextlib.suppress(Exception):
                await ctx.wakeups.set_waiting(self.tps, False)
            self._waiting = False
        await self._drop_publisher()


def _partitions(records: Sequence[OutboxRecord]) -> set[TopicPartition]:
    """The partitions of ``records`` (one object per partition, not per record)."""
    return {TopicPartition(t, p) for t, p in {(r.topic, r.partition) for r in records}}


def retrying(
    settings: RelaySettings,
    log: structlog.typing.FilteringBoundLogger,
    stop: asyncio.Event | None,
    on_error: Callable[[BaseException], None],
) -> AsyncRetrying:
    """Backoff for retriable errors (capped at ``retry_backoff_max``), cut short by ``stop``."""

    async def sleep(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await (stop or asyncio.Event()).wait()

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if error is None:
            return
        on_error(error)
        # The first failure of a streak is a warning; the relay's watch then reports a failing
        # relay every few seconds (backlog, time since the last success) instead of every try.
        (log.warning if state.attempt_number == 1 else log.debug)(
            "retrying after error",
            error=describe(error),
            attempt=state.attempt_number,
            wait=round(state.upcoming_sleep, 3),
        )

    return AsyncRetrying(
        retry=retry_if_exception_type(RETRIABLE),
        wait=wait_exponential_jitter(multiplier=0.05, max=settings.retry_backoff_max, jitter=0.2),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


def _cut_by_bytes(records: list[OutboxRecord], share: int) -> set[TopicPartition]:
    """The partitions whose records in this claim reached their share of ``max_claim_bytes``:
    the storage may have more of them (it stops once the bytes before a record reach it)."""
    size: dict[TopicPartition, int] = {}
    for record in records:
        tp = TopicPartition(record.topic, record.partition)
        size[tp] = size.get(tp, 0) + record_bytes(record)
    return {tp for tp, n in size.items() if n >= share}
