"""The inbox worker: the loop that polls Kafka and composes the delivery path and the offset
committer.

Kafka → decode → (dedupe row + handler) in one DB transaction → offset. The partitions of a poll
are delivered concurrently, each in order (:mod:`outboxkit.inbox.delivery`: decode, dedupe,
handlers in the store's transactions within the time budget, split, retries, dead letters). The
Kafka offset of a record is committed only after its database transaction committed
(:mod:`outboxkit.inbox.offsets`: regularly, past transaction markers, on revocation and when
leaving), so a crash in between redelivers it and the dedupe row absorbs it (guarantee G6). Bad
input is contained (G8): it goes to the dead-letter topic ``<topic><dlq_suffix>``
(:mod:`outboxkit.inbox.deadletter`); a record that cannot be dead-lettered for good parks its
partition: the worker stops fetching it, says so in its health and logs, and goes on with the
other partitions. A side task purges expired dedupe records.

A worker whose database does not answer waits on the same records (G8), and its partitions with
it; once its transactions have failed for ``step_aside_after`` it **steps aside**
(:mod:`outboxkit.core.step_aside`, as a relay does): it stops where it is at its next retry,
commits the offsets of what its database committed, leaves the group (the other workers read
its partitions from there: what it may have committed unheard is absorbed by the dedupe
records) and rejoins once the database answers a ping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Generic

import structlog
from aiokafka.structs import TopicPartition

from outboxkit.core import kafka_clients, kafka_internals
from outboxkit.core.kafka import leave_group
from outboxkit.core.step_aside import StepAside
from outboxkit.core.supervisor import Supervisor
from outboxkit.core.waiting import sleep_unless_cancelled, wait_set
from outboxkit.inbox.deadletter import DeadLetterWriter
from outboxkit.inbox.delivery import DeliveryPath, wait_or_stop
from outboxkit.inbox.exceptions import InboxStorageUnavailableError
from outboxkit.inbox.handlers import TX, Inbox
from outboxkit.inbox.kafka import Fetched, InboxConsumer
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.offsets import CommitOnRevoke, OffsetCommitter
from outboxkit.inbox.progress import PartitionState, troubled
from outboxkit.inbox.settings import InboxSettings
from outboxkit.inbox.store import InboxStore
from outboxkit.inbox.transactions import TransactionHealth

logger = structlog.get_logger("outboxkit.inbox")

#: A worker out of its group asks its database this often whether it answers again.
_PING_EVERY = 1.0


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
    #: Seconds the worker has been out of its group because its database does not answer
    #: (``step_aside_after``): the other workers handle its partitions until it rejoins.
    stepped_aside_for: float | None = None

    @property
    def healthy(self) -> bool:
        return (
            self.running
            and self.database_available
            and not self.partitions
            and self.stepped_aside_for is None
        )


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
        #: Clear while a poll's records are delivered: a revocation waits for it.
        self._idle = asyncio.Event()
        self._idle.set()
        self._transaction_health = TransactionHealth()
        self._offsets: OffsetCommitter | None = None
        self._log = logger.bind(inbox=inbox.name)
        self._running = False
        #: Out of its group while the database does not answer (made by :meth:`run`).
        self._aside: StepAside | None = None

    def health(self) -> InboxHealth:
        now = time.time()
        offsets = self._offsets
        partitions = offsets.partitions if offsets is not None else {}
        pending = offsets.pending() if offsets is not None else {}
        state = self._transaction_health
        return InboxHealth(
            running=self._running,
            assigned=sorted(f"{tp.topic}/{tp.partition}" for tp in partitions),
            lag={f"{tp.topic}/{tp.partition}": n for tp, n in sorted(pending.items())},
            seconds_since_progress=(
                None if state.last_progress is None else now - state.last_progress
            ),
            last_error=state.last_error,
            database_available=state.database_available and self.store.unanswered_for() is None,
            partitions=troubled(partitions, pending, self.settings.stall_after, now),
            stepped_aside_for=None if self._aside is None else self._aside.aside_for(),
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
        offsets = OffsetCommitter(consumer, s, inbox=self.inbox.name, metrics=self.metrics)
        self._offsets = offsets
        membership = _Membership(consumer, offsets, s, self._idle, self._log)
        membership.step_in()
        aside = self._aside = StepAside(
            self._transaction_health.unavailable_for,
            membership,
            s.step_aside_after,
            others="the other workers handle this worker's partitions",
            gauge=self.metrics.stepped_aside.labels(self.inbox.name).set,
            log=self._log,
        )
        producer = kafka_clients.producer(
            s,
            acks="all",
            enable_idempotence=s.dlq_idempotence,
            max_request_size=max(1024 * 1024, s.dlq_max_bytes + 1024),
            client_id=f"{self.group_id}.dlq",
        )
        dead_letters = DeadLetterWriter(
            producer,
            inbox=self.inbox.name,
            suffix=s.dlq_suffix,
            max_bytes=s.dlq_max_bytes,
            metrics=self.metrics,
            pause=partial(wait_or_stop, self._stopping, s.retry_backoff_max),
        )
        delivery = DeliveryPath(
            self.inbox,
            s,
            self.store,
            dead_letters=dead_letters,
            stopping=self._stopping,
            metrics=self.metrics,
            health=self._transaction_health,
            leaving=aside.due,
        )
        await producer.start()
        try:
            await consumer.start()
            side_tasks = Supervisor("inbox")
            side_tasks.start("cleanup", self._clean_up())
            side_tasks.start("commit", offsets.commit_regularly(s.commit_interval))
            self._running = True
            try:
                while not self._stopping.is_set():
                    batches = await consumer.poll(timeout_ms=500, max_records=s.max_records)
                    if batches:
                        await self._deliver_poll(consumer, offsets, delivery, batches)
                    await aside.check()
                    if aside.aside_since is not None:
                        await self._until_answered()
                        await aside.check()
                        continue
                    await offsets.skip_invisible()
                    side_tasks.check()  # a dead side task stops the worker loudly
            finally:
                self._running = False
                await side_tasks.cancel()
                kafka_internals.abandoned_commits_read()  # a periodic commit cut short
                await leave_group(
                    self._commit_and_stop(consumer, offsets),
                    within=2 * s.session_timeout,
                    who=self.group_id,
                )
        finally:
            await producer.stop()
            self._log.info("inbox stopped")

    async def _deliver_poll(
        self,
        consumer: InboxConsumer,
        offsets: OffsetCommitter,
        delivery: DeliveryPath[TX],
        batches: dict[TopicPartition, list[Fetched]],
    ) -> None:
        """Deliver each partition's records, the partitions concurrently; stop fetching a
        partition the delivery path parked."""

        async def partition(tp: TopicPartition, records: list[Fetched]) -> None:
            if not await delivery.deliver(tp, records, offsets.partition(tp)):
                consumer.pause(tp)

        self._idle.clear()
        try:
            await asyncio.gather(*(partition(tp, rs) for tp, rs in batches.items()))
        finally:
            self._idle.set()

    async def _until_answered(self) -> None:
        """Out of the group: ping the database every second until it answers (the outage is
        then over) or the worker stops."""
        while not self._stopping.is_set():
            try:
                await self.store.ping()
            except InboxStorageUnavailableError:
                self.metrics.storage_errors.labels(self.inbox.name).inc()
                await wait_set(self._stopping, _PING_EVERY)
            else:
                self._transaction_health.available()
                return

    async def _commit_and_stop(self, consumer: InboxConsumer, offsets: OffsetCommitter) -> None:
        """Commit the offsets of what the database committed, then leave the group. The caller
        bounds it (aiokafka retries a commit for as long as the coordinator is away): what is
        left uncommitted is read again by the next owner and absorbed by the dedupe rows."""
        await offsets.commit(only=set(offsets.partitions))
        await consumer.stop()

    async def _clean_up(self) -> None:
        """Side task: purge expired dedupe records, and count what is left (a metric)."""
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
            await sleep_unless_cancelled(self.settings.cleanup_interval)


@dataclass
class _Membership:
    """The inbox worker's side of stepping aside (:class:`~outboxkit.core.step_aside.StepAside`):
    leaving commits the offsets of what its database committed first (bounded: Kafka may be
    away too; what is left is read again and absorbed by the dedupe records), then forgets its
    partitions and unsubscribes; joining subscribes again."""

    consumer: InboxConsumer
    offsets: OffsetCommitter
    settings: InboxSettings
    idle: asyncio.Event
    log: structlog.typing.FilteringBoundLogger

    async def step_aside(self) -> None:
        mine = set(self.offsets.partitions)
        try:
            async with asyncio.timeout(self.settings.session_timeout):
                await self.offsets.commit(only=mine)
        except Exception as exc:
            self.log.info("could not commit before leaving the group", error=repr(exc))
        self.offsets.forget(mine)
        self.consumer.unsubscribe()

    def step_in(self) -> None:
        self.consumer.subscribe(
            self.settings.topics, listener=CommitOnRevoke(self.offsets, self.idle)
        )
