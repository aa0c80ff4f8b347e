"""The inbox's delivery path: a partition's records → decode → (dedupe row + handler) in the
store's transactions → the partition's offset moves on.

Records of a partition are handled in order, several per store transaction
(:mod:`outboxkit.inbox.transactions`: the time budget's split, retries, outages); the offset of a
record moves on only once its transaction committed, or the record was absorbed as a duplicate
or dead-lettered (G6; committing the offset to Kafka is :mod:`outboxkit.inbox.offsets`' job).
Bad input is contained (G8): a record that is too large, does not decode or cannot even be read
by the Kafka client goes to the dead-letter topic, and so does one whose handler keeps raising.
A record that cannot be dead-lettered for good parks its partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Generic

import structlog
from aiokafka.structs import ConsumerRecord, TopicPartition

from outboxkit.core.waiting import wait_set
from outboxkit.inbox.deadletter import DeadLetterWriter
from outboxkit.inbox.handlers import TX, Inbox
from outboxkit.inbox.kafka import Fetched, UnreadableRecord
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.progress import PartitionProgress
from outboxkit.inbox.settings import InboxSettings
from outboxkit.inbox.store import Delivery, InboxStore
from outboxkit.inbox.transactions import TransactionHealth, TransactionRunner
from outboxkit.schemas import EventDecodeError, ForeignForm

logger = structlog.get_logger("outboxkit.inbox")


class Stopping(Exception):
    """The worker was asked to stop, or is leaving its group (its database does not answer),
    while waiting to retry."""


class _Parked(Exception):
    """A record of the partition cannot be dead-lettered for good: stop consuming it."""


async def wait_or_stop(
    stopping: asyncio.Event, seconds: float, leaving: Callable[[], bool] = lambda: False
) -> None:
    """Wait ``seconds`` before a retry; raise :class:`Stopping` if asked to stop meanwhile, or
    if the worker is ``leaving`` its group then."""
    if await wait_set(stopping, seconds) or leaving():
        raise Stopping


class DeliveryPath(Generic[TX]):
    """Takes the records of ``inbox``'s partitions into ``store``'s transactions. ``stopping``
    ends the work between records and cuts the pauses short; ``leaving`` (asked after each
    pause for the database) ends it too, the records not taken effect for left to whoever reads
    them next; ``health`` is what the transactions report (the worker's health shows it)."""

    def __init__(
        self,
        inbox: Inbox[TX],
        settings: InboxSettings,
        store: InboxStore[TX],
        *,
        dead_letters: DeadLetterWriter,
        stopping: asyncio.Event,
        metrics: InboxMetrics,
        health: TransactionHealth | None = None,
        leaving: Callable[[], bool] = lambda: False,
    ) -> None:
        self._inbox = inbox
        self._name = inbox.name
        self._settings = settings
        self._dead_letters = dead_letters
        self._stopping = stopping
        self._metrics = metrics
        self._transactions = TransactionRunner(
            inbox.name,
            settings,
            store,
            metrics=metrics,
            pause=partial(wait_or_stop, stopping, leaving=leaving),
            dead_letter=self._dead_letter,
            health=health,
        )
        self.health = self._transactions.health
        self._log = logger.bind(inbox=inbox.name)

    async def deliver(
        self, tp: TopicPartition, records: list[Fetched], progress: PartitionProgress
    ) -> bool:
        """Handle ``records`` of ``tp`` in order, moving ``progress``' offset. False when the
        partition got parked (now or before): the caller stops fetching it."""
        if progress.parked is not None:
            return False
        if progress.offset is None:
            progress.offset = records[0].offset
        self._metrics.consumed.labels(self._name, tp.topic).inc(len(records))
        batch: list[Delivery[TX]] = []
        decode = self._inbox.registry.decode_record
        handler_for = self._inbox.handler_for
        batch_handler_for = self._inbox.batch_handler_for
        max_bytes = self._settings.max_record_bytes
        size = self._settings.transaction_batch
        unknown: list[str] = []
        foreign: list[ForeignForm] = []
        try:
            for record in records:
                if self._stopping.is_set():
                    break
                if type(record) is UnreadableRecord:
                    await self._transactions.run(tp, batch, progress)
                    await self._unreadable(record, progress)
                    continue
                assert isinstance(record, ConsumerRecord)
                unknown.clear()
                foreign.clear()
                try:
                    event = decode(
                        record, max_bytes=max_bytes, unknown_fields=unknown, foreign_forms=foreign
                    )
                except EventDecodeError as exc:
                    await self._transactions.run(tp, batch, progress)
                    await self._dead_letter(record, str(exc.reason), exc, progress)
                    progress.advance(record.offset + 1)
                    continue
                if unknown:
                    self._metrics.unknown_fields.labels(
                        self._name, event.event_type, str(event.event_version)
                    ).inc()
                for form in foreign:
                    self._metrics.foreign_records.labels(
                        self._name, event.event_type, form.value
                    ).inc()
                handler = handler_for(event)
                if handler is None:  # registered for decoding only: nothing to do
                    await self._transactions.run(tp, batch, progress)
                    progress.advance(record.offset + 1)
                    continue
                batch.append(
                    Delivery(
                        event,
                        handler,
                        tp.topic,
                        tp.partition,
                        record.offset,
                        record,
                        batch_handler_for(event),
                    )
                )
                if len(batch) >= size:
                    await self._transactions.run(tp, batch, progress)
            await self._transactions.run(tp, batch, progress)
        except Stopping:
            return True
        except _Parked:
            progress.parked = progress.last_error or "a record cannot be dead-lettered"
            self._metrics.parked.labels(self._name, tp.topic, str(tp.partition)).set(1)
            return False
        return True

    async def _unreadable(self, record: UnreadableRecord, progress: PartitionProgress) -> None:
        self._metrics.unreadable.labels(self._name, record.topic).inc()
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

    async def _dead_letter(
        self,
        record: ConsumerRecord[bytes, bytes] | UnreadableRecord,
        reason: str,
        error: BaseException | str,
        progress: PartitionProgress,
    ) -> None:
        """Write the record to its dead-letter topic; retry until Kafka has it (never drop),
        or park the partition when Kafka will never take it."""
        if not await self._dead_letters.write(record, reason, error, progress):
            raise _Parked
