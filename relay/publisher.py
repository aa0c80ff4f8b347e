"""Publishing one block's batch to Kafka.

With transactions (the default) each batch is one Kafka transaction of a producer whose
``transactional.id`` belongs to the block (:mod:`outboxkit.relay.blocks`): a new owner of any of
the block's partitions initialises that id (and every other id that could carry the partition),
which aborts a zombie's open transaction and refuses its later sends, so only the current
owner's records ever become visible to ``read_committed`` consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from outboxkit.core import kafka_clients, kafka_internals
from outboxkit.core.kafka import AUTHORIZATION_ERRORS, denied
from outboxkit.relay.blocks import Block
from outboxkit.relay.exceptions import OwnershipLostError
from outboxkit.relay.records import OutboxRecord, PublishOutcome
from outboxkit.relay.settings import RelaySettings

#: Errors that say the broker will never accept this record as it is.
RECORD_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTopicError,
    TopicAuthorizationFailedError,
)

#: Bytes of the largest produce request (aiokafka's default): a larger record is rejected
#: before sending.
MAX_REQUEST_SIZE = 1024 * 1024

#: Errors that say another producer took this block's transactional.id.
FENCED_ERRORS: tuple[type[KafkaError], ...] = (
    ProducerFenced,
    InvalidProducerEpoch,
    TransactionalIdAuthorizationFailed,
)


@dataclass
class StageTimes:
    """Seconds one publish spent in each stage (for the per-stage breakdown and slow logs),
    and the stage it is in now (for the relay's watch on stages that run long)."""

    #: begin, AddPartitionsToTxn and Produce, until every record is acknowledged.
    send: float = 0.0
    #: EndTxn (the broker then writes the commit markers).
    commit: float = 0.0
    current: str = "send"
    since: float = field(default_factory=time.monotonic)

    def enter(self, stage: str) -> None:
        self.current, self.since = stage, time.monotonic()


class Publisher(Protocol):
    """Publishes batches of one block; one instance per ownership of that block."""

    async def start(self) -> None:
        """Connect; with transactions this fences earlier users of the block's id."""

    async def publish(
        self, records: Sequence[OutboxRecord], times: StageTimes, *, alone: bool = False
    ) -> PublishOutcome:
        """Publish ``records`` (at most one per key, all in the block's partitions), filling
        ``times`` as the stages pass. Raises :class:`OwnershipLostError` if fenced, or a
        retriable error for the whole batch. After the broker refused anything (the outcome's
        ``rejected`` or ``refused_batch``), replace the publisher: an idempotent producer's
        sequence numbers no longer match the broker's."""

    async def close(self) -> None: ...


PublisherFactory = Callable[[Block], Publisher]


def describe(exc: BaseException) -> str:
    """An error as a log line's ``error`` shows it: its type and message (its docstring's first
    line when it has none, never an empty ``Name: ``)."""
    if isinstance(exc, AUTHORIZATION_ERRORS):
        return f"Kafka does not allow this relay {denied(exc, 'WRITE')}"
    message = str(exc) or (type(exc).__doc__ or "").strip().split("\n")[0]
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A send's failure is reported through the batch; never as "exception never retrieved"."""
    if not future.cancelled():
        future.exception()


# -- the publisher ------------------------------------------------------------------------------


@dataclass
class _Sent:
    """Records handed to the producer: each group shares one future (one record, or one
    partition's batch)."""

    groups: list[tuple[list[OutboxRecord], asyncio.Future[Any]]] = field(default_factory=list)

    @property
    def records(self) -> list[OutboxRecord]:
        return [record for group, _ in self.groups for record in group]


class KafkaPublisher:
    def __init__(self, block: Block, settings: RelaySettings) -> None:
        self.block = block
        self._transactional = settings.transactional
        # aiokafka's producer, retrying AddPartitionsToTxn sooner and quiet about a fence it
        # already reported (kafka_internals.TransactionalProducer).
        self._producer = kafka_clients.build(
            kafka_internals.TransactionalProducer,
            settings,
            acks="all",
            enable_idempotence=settings.transactional,
            transactional_id=(
                block.transactional_id(settings.group_id) if settings.transactional else None
            ),
            transaction_timeout_ms=int(settings.transaction_timeout * 1000),
            request_timeout_ms=int(max(settings.transaction_timeout, 10) * 1000),
            linger_ms=0,
            # One batch per partition per transaction: up to batch_size records of ~1 KB.
            max_batch_size=1024 * 1024,
            max_request_size=MAX_REQUEST_SIZE,
            client_id=f"{settings.group_id}-{block}",
        )

    async def start(self) -> None:
        try:
            await self._producer.start()
        except FENCED_ERRORS as exc:
            await self.close()
            raise OwnershipLostError(f"{self.block}: {describe(exc)}") from exc

    async def close(self) -> None:
        # A fenced producer may fail to stop cleanly; it is discarded either way.
        with contextlib.suppress(KafkaError, AssertionError, OSError):
            await self._producer.stop()

    async def publish(
        self, records: Sequence[OutboxRecord], times: StageTimes, *, alone: bool = False
    ) -> PublishOutcome:
        try:
            if self._transactional:
                return await self._publish_transaction(records, times, alone=alone)
            return await self._publish_plain(records, times, alone=alone)
        except FENCED_ERRORS as exc:
            raise OwnershipLostError(f"{self.block}: {describe(exc)}") from exc
        except AssertionError as exc:
            # aiokafka's transaction manager asserts once fenced (FATAL_ERROR state): the
            # producer is unusable and the block is someone else's.
            raise OwnershipLostError(f"{self.block}: producer in a fatal state ({exc})") from exc

    async def _send(
        self, records: Sequence[OutboxRecord], outcome: PublishOutcome, *, alone: bool
    ) -> _Sent:
        """Append the records of each partition to one record batch and hand it over with
        ``send_batch``: no future and no accumulator lookup per record, so much less CPU than
        one ``send`` per record (bench/results/relay.md, "Drain with few keys"), the same bytes
        on the wire. The broker accepts or refuses a record batch whole: ``alone`` puts each record
        in a record batch of its own, to tell which one it refuses. A record too large for any
        request is rejected here, as ``send`` would."""
        by_partition: dict[tuple[str, int], list[OutboxRecord]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record)
        sent = _Sent()
        producer = self._producer
        try:
            for (topic, partition), group in by_partition.items():
                batch = producer.create_batch()
                members: list[OutboxRecord] = []
                for record in group:
                    headers = list(record.headers)
                    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
                        record.key, record.value, headers
                    )
                    if size > MAX_REQUEST_SIZE:
                        error = MessageSizeTooLargeError(
                            f"the record is {size} bytes serialized, over the producer's "
                            f"max_request_size ({MAX_REQUEST_SIZE})"
                        )
                        outcome.rejected.append((record, describe(error)))
                        continue
                    entry = {"key": record.key, "value": record.value, "headers": headers}
                    if members and (alone or batch.append(timestamp=None, **entry) is None):
                        # Full, or one record per batch: hand it over, start another.
                        future = await producer.send_batch(batch, topic, partition=partition)
                        sent.groups.append((members, future))
                        batch, members = producer.create_batch(), []
                    if not members:  # the first record of a batch always fits
                        batch.append(timestamp=None, **entry)
                    members.append(record)
                if members:
                    future = await producer.send_batch(batch, topic, partition=partition)
                    sent.groups.append((members, future))
        except BaseException:
            for _, earlier in sent.groups:
                earlier.add_done_callback(_retrieve)
            raise
        for _, future in sent.groups:
            future.add_done_callback(_retrieve)
        return sent

    async def _publish_transaction(
        self, records: Sequence[OutboxRecord], times: StageTimes, *, alone: bool
    ) -> PublishOutcome:
        outcome = PublishOutcome()
        began = time.perf_counter()
        times.enter("send")
        await self._producer.begin_transaction()
        try:
            sent = await self._send(records, outcome, alone=alone)
            results = await asyncio.gather(*(f for _, f in sent.groups), return_exceptions=True)
            failures = [
                (group, e)
                for (group, _), e in zip(sent.groups, results, strict=True)
                if isinstance(e, BaseException)
            ]
            if failures:
                raise _BatchFailedError(failures)
            acked = time.perf_counter()
            times.send = acked - began
            times.enter("commit")
            await self._producer.commit_transaction()
            times.commit = time.perf_counter() - acked
        except _BatchFailedError as batch:
            refused = [e for _, e in batch.failures if isinstance(e, AUTHORIZATION_ERRORS)]
            if refused:
                # Not a fencing: an ACL is missing. The producer is in a fatal state; the
                # worker drops it, says which permission, and retries with backoff.
                await _abort_quietly(self._producer)
                raise refused[0] from None
            await self._producer.abort_transaction()
            # Nothing of this transaction is visible; only errors of a record itself count
            # against it, the rest is retried as it is. (After a refused batch, the broker
            # fails the partition's later batches out of sequence: the refusal is what counts.)
            for group, error in batch.failures:
                if isinstance(error, RECORD_ERRORS) and len(group) > 1:
                    outcome.refused_batch = True
                elif isinstance(error, RECORD_ERRORS):
                    outcome.rejected.append((group[0], describe(error)))
            others = [e for _, e in batch.failures if not isinstance(e, RECORD_ERRORS)]
            if others and not outcome.rejected and not outcome.refused_batch:
                raise others[0] from None
            return outcome
        except BaseException:
            await _abort_quietly(self._producer)
            raise
        outcome.published = sent.records
        return outcome

    async def _publish_plain(
        self, records: Sequence[OutboxRecord], times: StageTimes, *, alone: bool
    ) -> PublishOutcome:
        outcome = PublishOutcome()
        began = time.perf_counter()
        sent = await self._send(records, outcome, alone=alone)
        results = await asyncio.gather(*(f for _, f in sent.groups), return_exceptions=True)
        times.send = time.perf_counter() - began
        first_error: BaseException | None = None
        for (group, _), result in zip(sent.groups, results, strict=True):
            if not isinstance(result, BaseException):
                outcome.published += group
            elif isinstance(result, RECORD_ERRORS) and len(group) > 1:
                outcome.refused_batch = True
            elif isinstance(result, RECORD_ERRORS):
                outcome.rejected.append((group[0], describe(result)))
            elif first_error is None:
                first_error = result
        if first_error is not None and not (
            outcome.published or outcome.rejected or outcome.refused_batch
        ):
            raise first_error
        return outcome


class _BatchFailedError(Exception):
    def __init__(self, failures: list[tuple[list[OutboxRecord], BaseException]]) -> None:
        super().__init__(f"{len(failures)} record(s) failed")
        self.failures = failures


async def _abort_quietly(producer: AIOKafkaProducer) -> None:
    # The producer is discarded after this anyway.
    with contextlib.suppress(Exception):
        await producer.abort_transaction()
