"""The inbox worker: Kafka → decode → (dedupe row + handler) in one DB transaction → offset.

Records of a partition are handled in order; the partitions of a poll run concurrently. The
Kafka offset of a record is committed only after its database transaction committed, so a crash
in between redelivers it and the dedupe row absorbs it (guarantee G6). Bad input is contained
(G8): a record that does not decode, or whose handler keeps raising, goes to the dead-letter
topic ``<topic><dlq_suffix>`` with its original bytes and headers saying why; a database outage
is not the record's fault: the worker pauses and retries the same record without moving on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition
from tenacity import (
    AsyncRetrying,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from outboxkit.core.kafka import leave_group
from outboxkit.inbox.deadletter import dead_letter_headers
from outboxkit.inbox.exceptions import InboxStorageUnavailableError
from outboxkit.inbox.handlers import TX, Handler, Inbox
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.settings import InboxSettings
from outboxkit.inbox.store import Delivery, InboxStore
from outboxkit.schemas import Event, EventDecodeError

logger = structlog.get_logger("outboxkit.inbox")

#: Test hook, never set in production: the probability of SIGKILLing this process right after a
#: record's database commit and before its offset commit (the crash G6 is about).
_CRASH_AFTER_COMMIT = float(os.environ.get("OUTBOXKIT_TEST_CRASH_AFTER_COMMIT", "0") or 0)


class _Stopping(Exception):
    """The worker was asked to stop while waiting to retry."""


@dataclass
class InboxHealth:
    """What a probe reports about an inbox worker. ``healthy`` is false when the worker is not
    running or the database has been unavailable since ``last_error``."""

    running: bool
    assigned: list[str]
    #: Records behind the partition's high watermark, as of the last poll.
    lag: dict[str, int] = field(default_factory=dict)
    seconds_since_progress: float | None = None
    last_error: str | None = None
    database_available: bool = True

    @property
    def healthy(self) -> bool:
        return self.running and self.database_available


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
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._pending_offsets: dict[TopicPartition, int] = {}
        self._log = logger.bind(inbox=inbox.name)
        self._running = False
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._lag: dict[TopicPartition, int] = {}
        self._last_progress: float | None = None
        self._last_error: str | None = None
        self._database_available = True

    def health(self) -> InboxHealth:
        since = None if self._last_progress is None else time.monotonic() - self._last_progress
        return InboxHealth(
            running=self._running,
            assigned=sorted(f"{tp.topic}/{tp.partition}" for tp in self._assigned),
            lag={f"{tp.topic}/{tp.partition}": n for tp, n in sorted(self._lag.items())},
            seconds_since_progress=since,
            last_error=self._last_error,
            database_available=self._database_available,
        )

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        s = self.settings
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap_servers,
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
        producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            acks="all",
            enable_idempotence=s.dlq_idempotence,
            client_id=f"{self.group_id}.dlq",
        )
        self._consumer, self._producer = consumer, producer
        await producer.start()
        try:
            await consumer.start()
            cleanup = asyncio.create_task(self._clean_up(), name="cleanup")
            self._running = True
            try:
                while not self._stopping.is_set():
                    batches = await consumer.getmany(timeout_ms=500)
                    if batches:
                        await self._process_poll(consumer, batches)
                    if cleanup.done():
                        cleanup.result()  # a dead side task stops the worker loudly
            finally:
                self._running = False
                cleanup.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await cleanup
                await leave_group(
                    self._commit_and_stop(consumer),
                    within=2 * s.session_timeout,
                    who=self.group_id,
                )
        finally:
            await producer.stop()
            self._log.info("inbox stopped")

    # -- a poll ------------------------------------------------------------------------------

    async def _process_poll(
        self,
        consumer: AIOKafkaConsumer,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        self._idle.clear()
        try:
            await asyncio.gather(*(self._process_partition(tp, rs) for tp, rs in batches.items()))
        finally:
            self._idle.set()
        await self._commit(consumer)
        for tp in batches:
            high = consumer.highwater(tp)
            if high is not None and tp in self._pending_offsets:
                lag = max(high - self._pending_offsets[tp], 0)
                self._lag[tp] = lag
                self.metrics.lag.labels(self.inbox.name, tp.topic, str(tp.partition)).set(lag)

    async def _process_partition(
        self, tp: TopicPartition, records: list[ConsumerRecord[bytes, bytes]]
    ) -> None:
        """Handle ``records`` in order, several per database transaction. A record's offset is
        marked done only once its transaction committed (or it was absorbed or dead-lettered)."""
        batch: list[tuple[ConsumerRecord[bytes, bytes], Delivery[TX]]] = []
        self.metrics.consumed.labels(self.inbox.name, tp.topic).inc(len(records))
        try:
            for record in records:
                if self._stopping.is_set():
                    break
                try:
                    event = self.inbox.registry.decode_record(record)
                except EventDecodeError as exc:
                    await self._flush(tp, batch)
                    await self._dead_letter(record, str(exc.reason), exc)
                    self._pending_offsets[tp] = record.offset + 1
                    continue
                handler = self.inbox.handler_for(event)
                if handler is None:  # registered for decoding only: nothing to do
                    await self._flush(tp, batch)
                    self._pending_offsets[tp] = record.offset + 1
                    continue
                delivery = Delivery(event, handler, record.topic, record.partition, record.offset)
                batch.append((record, delivery))
                if len(batch) >= self.settings.transaction_batch:
                    await self._flush(tp, batch)
            await self._flush(tp, batch)
        except _Stopping:
            return

    async def _flush(
        self, tp: TopicPartition, batch: list[tuple[ConsumerRecord[bytes, bytes], Delivery[TX]]]
    ) -> None:
        """Commit ``batch`` in one transaction; a record whose handler raises goes through the
        one-record path (retries with backoff, then the dead-letter topic). Empties ``batch``."""
        while batch:
            started = time.perf_counter()
            try:
                outcome = await self.store.process_batch(self.inbox.name, [d for _, d in batch])
            except InboxStorageUnavailableError as exc:
                # Not the records' fault: keep the position and try the same batch again.
                self._storage_unavailable(exc)
                self._log.warning("database unavailable, pausing", error=str(exc))
                await self._pause()
                continue
            self._database_available = True
            self._last_progress = time.monotonic()
            if outcome.ran:
                self.metrics.handler_seconds.labels(self.inbox.name).observe(
                    (time.perf_counter() - started) / len(outcome.ran)
                )
            done, handled = len(outcome.ran), sum(outcome.ran)
            if done:
                self.metrics.handled.labels(self.inbox.name).inc(handled)
                self.metrics.duplicates.labels(self.inbox.name).inc(done - handled)
                self._pending_offsets[tp] = batch[done - 1][0].offset + 1
            if handled:
                _maybe_crash()
            if outcome.failed is not None:
                record = batch[done][0]
                await self._process_record(record)
                self._pending_offsets[tp] = record.offset + 1
                done += 1
            del batch[:done]

    async def _commit_and_stop(self, consumer: AIOKafkaConsumer) -> None:
        """Commit the offsets of what the database committed, then leave the group. The caller
        bounds it (aiokafka retries a commit for as long as the coordinator is away): what is
        left uncommitted is read again by the next owner and absorbed by the dedupe rows."""
        await self._commit(consumer)
        await consumer.stop()

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        if not self._pending_offsets:
            return
        offsets = {tp: OffsetAndMetadata(o, "") for tp, o in self._pending_offsets.items()}
        try:
            await consumer.commit(offsets)
            for tp, o in list(self._pending_offsets.items()):
                if offsets[tp].offset == o:
                    del self._pending_offsets[tp]
        except (CommitFailedError, KafkaError) as exc:
            # A rebalance took the partitions: their next owner re-reads from the last commit and
            # the dedupe rows absorb what this worker already did.
            self._log.warning("offset commit failed", error=repr(exc))
            self._pending_offsets.clear()

    # -- one record --------------------------------------------------------------------------

    async def _process_record(self, record: ConsumerRecord[bytes, bytes]) -> None:
        """One record on its own: retries a raising handler with backoff, then dead-letters."""
        try:
            event = self.inbox.registry.decode_record(record)
        except EventDecodeError as exc:
            await self._dead_letter(record, str(exc.reason), exc)
            return
        handler = self.inbox.handler_for(event)
        if handler is None:
            return  # registered for decoding only
        log = self._log.bind(event_id=str(event.id), event_type=event.event_type)
        while True:
            try:
                await self._handle(event, handler, record, log)
                self._database_available = True
                self._last_progress = time.monotonic()
                return
            except InboxStorageUnavailableError as exc:
                # Not the record's fault: keep the position and try the same record again.
                self._storage_unavailable(exc)
                log.warning("database unavailable, pausing", error=str(exc))
                await self._pause()
            except Exception as exc:  # the handler kept raising
                self._last_error = f"handler failed: {exc!r}"
                log.error("handler failed, dead-lettering", error=repr(exc))
                await self._dead_letter(record, "handler_failed", exc)
                return

    async def _handle(
        self,
        event: Event,
        handler: Handler[TX],
        record: ConsumerRecord[bytes, bytes],
        log: structlog.typing.FilteringBoundLogger,
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
                delivery = Delivery(event, handler, record.topic, record.partition, record.offset)
                outcome = await self.store.process_batch(self.inbox.name, [delivery])
                if outcome.failed is not None:
                    raise outcome.failed[1]
                [ran] = outcome.ran
                self.metrics.handler_seconds.labels(self.inbox.name).observe(
                    time.perf_counter() - started
                )
        if ran:
            self.metrics.handled.labels(self.inbox.name).inc()
            _maybe_crash()
        else:
            self.metrics.duplicates.labels(self.inbox.name).inc()
            log.debug("duplicate absorbed")

    async def _dead_letter(
        self, record: ConsumerRecord[bytes, bytes], reason: str, error: BaseException
    ) -> None:
        """Write the record to its dead-letter topic; retry until Kafka has it (never drop)."""
        assert self._producer is not None
        topic = f"{record.topic}{self.settings.dlq_suffix}"
        headers = dead_letter_headers(record, inbox=self.inbox.name, reason=reason, error=error)
        while True:
            try:
                await self._producer.send_and_wait(
                    topic, record.value, key=record.key, headers=headers
                )
                break
            except KafkaError as exc:
                self._log.error(
                    "cannot write to the dead-letter topic, retrying",
                    topic=topic,
                    error=repr(exc),
                    hint="create the topic, or fix OUTBOXKIT_DLQ_SUFFIX",
                )
                await self._pause()
        self.metrics.dead_lettered.labels(self.inbox.name, reason).inc()
        self._log.warning(
            "record dead-lettered",
            reason=reason,
            error=str(error)[:500],
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )

    def _storage_unavailable(self, exc: InboxStorageUnavailableError) -> None:
        self.metrics.storage_errors.labels(self.inbox.name).inc()
        self._database_available = False
        self._last_error = str(exc)

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


def _maybe_crash() -> None:
    """The test hook: after a database commit, before the offset commit."""
    if _CRASH_AFTER_COMMIT and int.from_bytes(os.urandom(4), "big") / 2**32 < _CRASH_AFTER_COMMIT:
        os.kill(os.getpid(), signal.SIGKILL)


class _CommitOnRevoke(ConsumerRebalanceListener, Generic[TX]):  # type: ignore[misc]
    """On revocation wait for the poll in progress, then commit what it finished. Never raises
    (aiokafka would swallow it): a failure only means redeliveries, which dedupe absorbs."""

    def __init__(self, worker: InboxWorker[TX]) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._worker._assigned -= revoked
        for tp in revoked:
            self._worker._lag.pop(tp, None)
        try:
            await self._worker._idle.wait()
            if self._worker._consumer is not None:
                await self._worker._commit(self._worker._consumer)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("committing on revocation failed")

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._worker._assigned |= assigned
