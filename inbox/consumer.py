"""The inbox worker: Kafka → decode → (dedupe row + handler) in one DB transaction → offset.

Records of a partition are handled in order; the partitions of a poll run concurrently. The
Kafka offset of a record is committed only after its database transaction committed, so a crash
in between redelivers it and the dedupe row absorbs it (guarantee G6). Bad input is contained
(G8): a record that is too large, does not decode, cannot even be read by the Kafka client, or
whose handler keeps raising goes to the dead-letter topic ``<topic><dlq_suffix>`` with its
original bytes (cut to fit if need be) and headers saying why; a database outage is not the
record's fault: the worker pauses and retries the same record without moving on. A record that
cannot be dead-lettered for good (refused by the dead-letter topic) parks its partition: the
worker says so in its health and logs, and goes on with the other partitions.

Offsets are committed by a side task every ``commit_interval``, with each partition's progress
and last error in the commit's metadata (:mod:`outboxkit.inbox.progress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic

import structlog
from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition
from tenacity import (
    AsyncRetrying,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from outboxkit.core import kafka_clients
from outboxkit.core.kafka import leave_group
from outboxkit.inbox.deadletter import DeadLetterWriter
from outboxkit.inbox.exceptions import InboxStorageUnavailableError, InboxTransactionTooLongError
from outboxkit.inbox.handlers import TX, Inbox
from outboxkit.inbox.kafka import Fetched, InboxConsumer, UnreadableRecord
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.progress import PartitionProgress, PartitionState, is_stalled
from outboxkit.inbox.settings import InboxSettings
from outboxkit.inbox.store import BatchOutcome, Delivery, InboxStore
from outboxkit.schemas import EventDecodeError

logger = structlog.get_logger("outboxkit.inbox")

#: Seconds between commits that refresh every partition's progress metadata, moved or not.
STATUS_REFRESH = 5.0


class _Stopping(Exception):
    """The worker was asked to stop while waiting to retry."""


class _Parked(Exception):
    """A record of the partition cannot be dead-lettered for good: stop consuming it."""


@dataclass
class InboxHealth:
    """What a probe reports about an inbox worker. ``healthy`` is false when the worker is not
    running, the database has been unavailable since ``last_error``, or a partition is stalled
    (records pending, no progress for ``stall_after``) or parked (see ``partitions``)."""

    running: bool
    assigned: list[str]
    #: Records behind the partition's high watermark, as of the last poll.
    lag: dict[str, int] = field(default_factory=dict)
    seconds_since_progress: float | None = None
    last_error: str | None = None
    database_available: bool = True
    #: The stalled and parked partitions, each with its offset and last error.
    partitions: list[PartitionState] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.running and self.database_available and not self.partitions


class InboxWorker(Generic[TX]):
    """Consumes ``settings.topics`` for ``inbox`` until :meth:`stop`, recording effects in
    ``store`` (whose transactions are the ones ``inbox``'s handlers expect)."""

    def __init__(
        self,
        inbox: Inbox[TX],
        settings: InboxSettings,
        store: InboxStore[TX],
        *,
        metrics: InboxMetrics | None = None,
    ) -> None:
        self.inbox = inbox
        self.settings = settings
        self.store = store
        self.metrics = metrics or InboxMetrics()
        self.group_id = f"outboxkit.inbox.{inbox.name}"
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._consumer: InboxConsumer | None = None
        self._dead_letters: DeadLetterWriter | None = None
        self._log = logger.bind(inbox=inbox.name)
        self._running = False
        self._progress: dict[TopicPartition, PartitionProgress] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._commit_lock = asyncio.Lock()
        self._last_refresh = 0.0
        self._last_progress: float | None = None
        self._last_error: str | None = None
        self._database_available = True

    def health(self) -> InboxHealth:
        now = time.time()
        since = None if self._last_progress is None else now - self._last_progress
        lag = {f"{tp.topic}/{tp.partition}": n for tp, n in sorted(self._pending().items())}
        return InboxHealth(
            running=self._running,
            assigned=sorted(f"{tp.topic}/{tp.partition}" for tp in self._progress),
            lag=lag,
            seconds_since_progress=since,
            last_error=self._last_error,
            database_available=self._database_available,
            partitions=self._troubled(now),
        )

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        s = self.settings
        consumer = kafka_clients.build(
            InboxConsumer,
            s,
            group_id=self.group_id,
            enable_auto_commit=False,
            isolation_level="read_committed",  # a fenced relay's aborted records stay invisible
            auto_offset_reset="earliest",
            max_poll_records=s.max_records,
            session_timeout_ms=int(s.session_timeout * 1000),
            heartbeat_interval_ms=int(s.heartbeat_interval * 1000),
            client_id=self.group_id,
        )
        consumer.subscribe(s.topics, listener=_CommitOnRevoke(self))
        producer = kafka_clients.producer(
            s,
            acks="all",
            enable_idempotence=s.dlq_idempotence,
            max_request_size=max(1024 * 1024, s.dlq_max_bytes + 1024),
            client_id=f"{self.group_id}.dlq",
        )
        self._consumer = consumer
        self._dead_letters = DeadLetterWriter(
            producer,
            inbox=self.inbox.name,
            suffix=s.dlq_suffix,
            max_bytes=s.dlq_max_bytes,
            metrics=self.metrics,
            pause=self._pause,
        )
        await producer.start()
        try:
            await consumer.start()
            side_tasks = [
                asyncio.create_task(self._clean_up(), name="cleanup"),
                asyncio.create_task(self._commit_regularly(consumer), name="commit"),
            ]
            self._running = True
            try:
                while not self._stopping.is_set():
                    batches = await consumer.poll(timeout_ms=500, max_records=s.max_records)
                    if batches:
                        await self._process_poll(batches)
                    await self._skip_invisible(consumer)
                    for task in side_tasks:
                        if task.done():
                            task.result()  # a dead side task stops the worker loudly
            finally:
                self._running = False
                for task in side_tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await leave_group(
                    self._commit_and_stop(consumer),
                    within=2 * s.session_timeout,
                    who=self.group_id,
                )
        finally:
            await producer.stop()
            self._log.info("inbox stopped")

    # -- a poll ------------------------------------------------------------------------------

    async def _process_poll(self, batches: dict[TopicPartition, list[Fetched]]) -> None:
        self._idle.clear()
        try:
            await asyncio.gather(*(self._process_partition(tp, rs) for tp, rs in batches.items()))
        finally:
            self._idle.set()

    async def _skip_invisible(self, consumer: InboxConsumer) -> None:
        """Move each caught-up partition's offset past the transaction markers (and aborted
        records) after its last record (:meth:`InboxConsumer.past_invisible`)."""
        for tp, progress in list(self._progress.items()):
            if progress.parked is None and progress.offset is not None:
                position = await consumer.past_invisible(tp, progress.offset)
                if position is not None:
                    progress.advance(position)

    async def _process_partition(self, tp: TopicPartition, records: list[Fetched]) -> None:
        """Handle ``records`` in order, several per database transaction. The partition's
        offset moves on only once a record's transaction committed (or it was absorbed or
        dead-lettered)."""
        progress = self._progress.setdefault(tp, PartitionProgress())
        if progress.parked is not None:
            return
        if progress.offset is None:
            progress.offset = records[0].offset
        self.metrics.consumed.labels(self.inbox.name, tp.topic).inc(len(records))
        batch: list[Delivery[TX]] = []
        decode = self.inbox.registry.decode_record
        handler_for = self.inbox.handler_for
        max_bytes = self.settings.max_record_bytes
        size = self.settings.transaction_batch
        try:
            for record in records:
                if self._stopping.is_set():
                    break
                if type(record) is UnreadableRecord:
                    await self._flush(tp, batch, progress)
                    self.metrics.unreadable.labels(self.inbox.name, tp.topic).inc()
                    self._log.error(
                        "unreadable record: the Kafka client cannot parse it; dead-lettering "
                        "what could be recovered and moving past it",
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        recovered=record.recovered,
                        error=record.error,
                    )
                    progress.error(f"unreadable record at offset {record.offset}")
                    await self._dead_letter(record, "unreadable_record", record.error, progress)
                    progress.advance(record.next_offset)
                    continue
                assert isinstance(record, ConsumerRecord)
                try:
                    event = decode(record, max_bytes=max_bytes)
                except EventDecodeError as exc:
                    await self._flush(tp, batch, progress)
                    await self._dead_letter(record, str(exc.reason), exc, progress)
                    progress.advance(record.offset + 1)
                    continue
                handler = handler_for(event)
                if handler is None:  # registered for decoding only: nothing to do
                    await self._flush(tp, batch, progress)
                    progress.advance(record.offset + 1)
                    continue
                batch.append(
                    Delivery(event, handler, tp.topic, tp.partition, record.offset, record)
                )
                if len(batch) >= size:
                    await self._flush(tp, batch, progress)
            await self._flush(tp, batch, progress)
        except _Stopping:
            return
        except _Parked:
            progress.parked = progress.last_error or "a record cannot be dead-lettered"
            self.metrics.parked.labels(self.inbox.name, tp.topic, str(tp.partition)).set(1)
            if self._consumer is not None:
                self._consumer.pause(tp)

    async def _flush(
        self, tp: TopicPartition, batch: list[Delivery[TX]], progress: PartitionProgress
    ) -> None:
        """Commit ``batch`` in one transaction; a delivery whose handler raises goes through the
        one-record path (retries with backoff, then the dead-letter topic). A transaction the
        database aborted for outliving its time limit is split in halves, down to one record,
        whose handler then counts as failing (G8). Empties ``batch``."""
        size = len(batch)
        while batch:
            started = time.perf_counter()
            chunk = batch[:size]
            try:
                outcome = await self.store.process_batch(self.inbox.name, chunk)
            except InboxTransactionTooLongError as exc:
                if len(chunk) == 1:
                    outcome = BatchOutcome(failed=(0, exc))
                else:
                    size = len(chunk) // 2
                    self.metrics.splits.labels(self.inbox.name).inc()
                    self._log.warning(
                        "transaction outlived the database's time limit, splitting the batch",
                        topic=tp.topic,
                        partition=tp.partition,
                        records=len(chunk),
                        into=size,
                        error=str(exc),
                    )
                    continue
            except InboxStorageUnavailableError as exc:
                # Not the records' fault: keep the position and try the same batch again.
                self._storage_unavailable(exc, progress)
                self._log.warning("database unavailable, pausing", error=str(exc))
                await self._pause()
                continue
            self._database_available = True
            self._last_progress = time.time()
            done, handled = len(outcome.ran), sum(outcome.ran)
            if done:
                self.metrics.handler_seconds.labels(self.inbox.name).observe(
                    (time.perf_counter() - started) / done
                )
                self.metrics.handled.labels(self.inbox.name).inc(handled)
                if done > handled:
                    self.metrics.duplicates.labels(self.inbox.name).inc(done - handled)
                progress.advance(batch[done - 1].offset + 1)
            if outcome.failed is not None:
                delivery = batch[done]
                await self._process_one(delivery, progress)
                progress.advance(delivery.offset + 1)
                done += 1
            del batch[:done]

    # -- offsets -----------------------------------------------------------------------------

    async def _commit_regularly(self, consumer: InboxConsumer) -> None:
        while True:
            await asyncio.sleep(self.settings.commit_interval)
            await self._commit(consumer)

    async def _commit(
        self, consumer: InboxConsumer, only: set[TopicPartition] | None = None
    ) -> None:
        """Commit each partition's offset — what the database committed — when it moved, and
        every partition's (with its progress metadata) every :data:`STATUS_REFRESH` seconds."""
        async with self._commit_lock:
            now = time.time()
            refresh = now - self._last_refresh >= STATUS_REFRESH
            pending = self._pending()
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            for tp, progress in list(self._progress.items()):
                if only is not None and tp not in only:
                    continue
                if progress.offset is None:
                    continue
                if pending.get(tp) == 0:
                    progress.progress_at = now  # nothing to do counts as keeping up
                stalled = progress.parked is None and is_stalled(
                    pending.get(tp), progress.progress_at, self.settings.stall_after, now
                )
                labels = (self.inbox.name, tp.topic, str(tp.partition))
                self.metrics.stalled.labels(*labels).set(int(stalled))
                if refresh or only is not None or progress.offset != self._committed.get(tp):
                    offsets[tp] = OffsetAndMetadata(progress.offset, progress.metadata())
            if not offsets:
                return
            try:
                await consumer.commit(offsets)
            except (CommitFailedError, KafkaError) as exc:
                # A rebalance took the partitions: their next owner re-reads from the last commit
                # and the dedupe rows absorb what this worker already did.
                self._log.warning("offset commit failed", error=repr(exc))
                return
            for tp, committed in offsets.items():
                self._committed[tp] = committed.offset
            if refresh and only is None:
                self._last_refresh = now

    def _pending(self) -> dict[TopicPartition, int]:
        """Records pending per partition: its end (last stable offset) past the next record to
        handle, as of the last fetch."""
        consumer = self._consumer
        pending: dict[TopicPartition, int] = {}
        if consumer is None:
            return pending
        assigned = consumer.assignment()
        for tp, progress in self._progress.items():
            if tp not in assigned:
                continue
            end = consumer.last_stable_offset(tp)
            if end is not None and progress.offset is not None:
                pending[tp] = max(end - progress.offset, 0)
                self.metrics.lag.labels(self.inbox.name, tp.topic, str(tp.partition)).set(
                    pending[tp]
                )
        return pending

    def _troubled(self, now: float) -> list[PartitionState]:
        pending = self._pending()
        troubled = []
        for tp, progress in sorted(self._progress.items()):
            if progress.parked is None and not is_stalled(
                pending.get(tp), progress.progress_at, self.settings.stall_after, now
            ):
                continue
            troubled.append(
                PartitionState(
                    partition=f"{tp.topic}/{tp.partition}",
                    offset=progress.offset,
                    pending=pending.get(tp),
                    seconds_since_progress=round(now - progress.progress_at, 1),
                    last_error=progress.last_error,
                    parked=progress.parked,
                )
            )
        return troubled

    async def _commit_and_stop(self, consumer: InboxConsumer) -> None:
        """Commit the offsets of what the database committed, then leave the group. The caller
        bounds it (aiokafka retries a commit for as long as the coordinator is away): what is
        left uncommitted is read again by the next owner and absorbed by the dedupe rows."""
        await self._commit(consumer, only=set(self._progress))
        await consumer.stop()

    # -- one record --------------------------------------------------------------------------

    async def _process_one(self, delivery: Delivery[TX], progress: PartitionProgress) -> None:
        """One delivery on its own: retries a raising handler with backoff, then dead-letters."""
        event = delivery.event
        log = self._log.bind(event_id=str(event.id), event_type=event.event_type)
        while True:
            try:
                await self._handle(delivery, log)
                self._database_available = True
                self._last_progress = time.time()
                return
            except InboxStorageUnavailableError as exc:
                # Not the record's fault: keep the position and try the same record again.
                self._storage_unavailable(exc, progress)
                log.warning("database unavailable, pausing", error=str(exc))
                await self._pause()
            except Exception as exc:  # the handler kept raising
                self._last_error = f"handler failed: {exc!r}"
                progress.error(self._last_error)
                log.error("handler failed, dead-lettering", error=repr(exc))
                assert delivery.record is not None
                await self._dead_letter(delivery.record, "handler_failed", exc, progress)
                return

    async def _handle(
        self, delivery: Delivery[TX], log: structlog.typing.FilteringBoundLogger
    ) -> None:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.handler_attempts),
            wait=wait_exponential_jitter(
                multiplier=0.05, max=self.settings.retry_backoff_max, jitter=0.2
            ),
            retry=retry_if_not_exception_type(InboxStorageUnavailableError),
            before_sleep=lambda state: log.warning(
                "handler raised, retrying",
                attempt=state.attempt_number,
                error=repr(state.outcome.exception() if state.outcome else None),
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                started = time.perf_counter()
                outcome = await self.store.process_batch(self.inbox.name, [delivery])
                if outcome.failed is not None:
                    raise outcome.failed[1]
                [ran] = outcome.ran
                self.metrics.handler_seconds.labels(self.inbox.name).observe(
                    time.perf_counter() - started
                )
        if ran:
            self.metrics.handled.labels(self.inbox.name).inc()
        else:
            self.metrics.duplicates.labels(self.inbox.name).inc()
            log.debug("duplicate absorbed")

    async def _dead_letter(
        self,
        record: ConsumerRecord[bytes, bytes] | UnreadableRecord,
        reason: str,
        error: BaseException | str,
        progress: PartitionProgress,
    ) -> None:
        """Write the record to its dead-letter topic; retry until Kafka has it (never drop),
        or park the partition when Kafka will never take it."""
        assert self._dead_letters is not None
        if not await self._dead_letters.write(record, reason, error, progress):
            raise _Parked

    def _storage_unavailable(
        self, exc: InboxStorageUnavailableError, progress: PartitionProgress
    ) -> None:
        self.metrics.storage_errors.labels(self.inbox.name).inc()
        self._database_available = False
        self._last_error = str(exc)
        progress.error(str(exc))

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.retry_backoff_max):
                await self._stopping.wait()
        if self._stopping.is_set():
            raise _Stopping

    # -- side task ---------------------------------------------------------------------------

    async def _clean_up(self) -> None:
        retention: timedelta = self.settings.inbox_retention
        while True:
            with contextlib.suppress(InboxStorageUnavailableError):
                deleted = self.settings.cleanup_batch
                while deleted == self.settings.cleanup_batch:
                    deleted = await self.store.purge(retention, self.settings.cleanup_batch)
                    self.metrics.cleaned.inc(deleted)
                self.metrics.dedupe_rows.labels(self.inbox.name).set(
                    await self.store.count(self.inbox.name)
                )
            await asyncio.sleep(self.settings.cleanup_interval)


class _CommitOnRevoke(ConsumerRebalanceListener, Generic[TX]):  # type: ignore[misc]
    """On revocation wait for the poll in progress, then commit what it finished. Never raises
    (aiokafka would swallow it): a failure only means redeliveries, which dedupe absorbs."""

    def __init__(self, worker: InboxWorker[TX]) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        worker = self._worker
        try:
            await worker._idle.wait()
            if worker._consumer is not None:
                await worker._commit(worker._consumer, only=set(revoked))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("committing on revocation failed")
        finally:
            for tp in revoked:
                worker._progress.pop(tp, None)
                worker._committed.pop(tp, None)
                labels = (worker.inbox.name, tp.topic, str(tp.partition))
                worker.metrics.parked.labels(*labels).set(0)
                worker.metrics.stalled.labels(*labels).set(0)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._worker._progress.setdefault(tp, PartitionProgress())
