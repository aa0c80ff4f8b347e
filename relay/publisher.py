"""Publishing one partition's batch to Kafka.

With transactions (the default) each batch is one Kafka transaction of a producer whose
``transactional.id`` belongs to the partition: starting it fences every earlier producer of that
partition (a zombie relay's open transaction is aborted, its later sends fail), so only the
current owner's records ever become visible to ``read_committed`` consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidProducerEpoch,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.producer import sender as aiokafka_sender

from outboxkit.relay.exceptions import OwnershipLostError
from outboxkit.relay.records import OutboxRecord, PublishOutcome, TopicPartition
from outboxkit.relay.settings import RelaySettings

# aiokafka retries AddPartitionsToTxn every 20 ms while the broker still writes the previous
# transaction's markers (CONCURRENT_TRANSACTIONS, KAFKA-5477). On a healthy broker that takes a
# few ms, so back-to-back transactions mostly wait for nothing: 2 ms cut the time to send a
# 10-record transaction from 34 to 12 ms (p50, Kafka 4.4, this machine). It only changes how
# soon that one retriable error is retried. A private constant: tests/unit checks it exists.
_CONCURRENT_TRANSACTIONS_BACKOFF = 0.002
if hasattr(aiokafka_sender, "BACKOFF_OVERRIDE"):
    aiokafka_sender.BACKOFF_OVERRIDE = _CONCURRENT_TRANSACTIONS_BACKOFF

#: Errors that say the broker will never accept this record as it is.
RECORD_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTopicError,
    TopicAuthorizationFailedError,
)

#: Errors that say another producer took this partition's transactional.id.
FENCED_ERRORS: tuple[type[KafkaError], ...] = (
    ProducerFenced,
    InvalidProducerEpoch,
    TransactionalIdAuthorizationFailed,
)


class Publisher(Protocol):
    """Publishes batches of one partition; one instance per ownership of that partition."""

    async def start(self) -> None:
        """Connect; with transactions this fences earlier owners of the partition."""

    async def publish(self, records: Sequence[OutboxRecord]) -> PublishOutcome:
        """Publish ``records`` (at most one per key). Raises :class:`OwnershipLostError` if
        fenced, or a retriable error for the whole batch."""

    async def close(self) -> None: ...


PublisherFactory = Callable[[TopicPartition], Publisher]


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class KafkaPublisher:
    def __init__(self, tp: TopicPartition, settings: RelaySettings) -> None:
        self.tp = tp
        self._transactional = settings.transactional
        self._producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            acks="all",
            enable_idempotence=settings.transactional,
            transactional_id=(
                settings.transactional_id(tp.topic, tp.partition)
                if settings.transactional
                else None
            ),
            transaction_timeout_ms=int(settings.transaction_timeout * 1000),
            request_timeout_ms=int(max(settings.transaction_timeout, 10) * 1000),
            linger_ms=0,
            client_id=f"{settings.group_id}-{tp}",
        )

    async def start(self) -> None:
        try:
            await self._producer.start()
        except FENCED_ERRORS as exc:
            raise OwnershipLostError(f"{self.tp}: {describe(exc)}") from exc

    async def close(self) -> None:
        # A fenced producer may fail to stop cleanly; it is discarded either way.
        with contextlib.suppress(KafkaError, AssertionError):
            await self._producer.stop()

    async def publish(self, records: Sequence[OutboxRecord]) -> PublishOutcome:
        try:
            if self._transactional:
                return await self._publish_transaction(records)
            return await self._publish_plain(records)
        except FENCED_ERRORS as exc:
            raise OwnershipLostError(f"{self.tp}: {describe(exc)}") from exc
        except AssertionError as exc:
            # aiokafka's transaction manager asserts once fenced (FATAL_ERROR state): the
            # producer is unusable and the partition is someone else's.
            raise OwnershipLostError(f"{self.tp}: producer in a fatal state ({exc})") from exc

    async def _send_all(
        self, records: Sequence[OutboxRecord], outcome: PublishOutcome
    ) -> list[tuple[OutboxRecord, asyncio.Future[object]]]:
        sent = []
        for record in records:
            try:
                future = await self._producer.send(
                    record.topic,
                    record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=list(record.headers),
                )
            except RECORD_ERRORS as exc:
                outcome.rejected.append((record, describe(exc)))
                continue
            sent.append((record, future))
        return sent

    async def _publish_transaction(self, records: Sequence[OutboxRecord]) -> PublishOutcome:
        outcome = PublishOutcome()
        await self._producer.begin_transaction()
        try:
            sent = await self._send_all(records, outcome)
            results = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
            failures = [
                (r, e)
                for (r, _), e in zip(sent, results, strict=True)
                if isinstance(e, BaseException)
            ]
            if failures:
                raise _BatchFailedError(failures)
            await self._producer.commit_transaction()
        except _BatchFailedError as batch:
            await self._producer.abort_transaction()
            # Nothing of this transaction is visible; only errors of a record itself count
            # against it, the rest is retried as it is.
            for record, error in batch.failures:
                if isinstance(error, RECORD_ERRORS):
                    outcome.rejected.append((record, describe(error)))
            others = [e for _, e in batch.failures if not isinstance(e, RECORD_ERRORS)]
            if others:
                raise others[0] from None
            return outcome
        except BaseException:
            await _abort_quietly(self._producer)
            raise
        outcome.published = [record for record, _ in sent]
        return outcome

    async def _publish_plain(self, records: Sequence[OutboxRecord]) -> PublishOutcome:
        outcome = PublishOutcome()
        sent = await self._send_all(records, outcome)
        results = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
        first_error: BaseException | None = None
        for (record, _), result in zip(sent, results, strict=True):
            if not isinstance(result, BaseException):
                outcome.published.append(record)
            elif isinstance(result, RECORD_ERRORS):
                outcome.rejected.append((record, describe(result)))
            elif first_error is None:
                first_error = result
        if first_error is not None and not outcome.published:
            raise first_error
        return outcome


class _BatchFailedError(Exception):
    def __init__(self, failures: list[tuple[OutboxRecord, BaseException]]) -> None:
        super().__init__(f"{len(failures)} record(s) failed")
        self.failures = failures


async def _abort_quietly(producer: AIOKafkaProducer) -> None:
    # The producer is discarded after this anyway.
    with contextlib.suppress(Exception):
        await producer.abort_transaction()
