"""Runs deliveries in the store's transactions: several per transaction, a transaction the
database aborted for outliving its time limit split in halves down to the one record that does
not fit (:mod:`outboxkit.inbox.budget`), a delivery whose handler raises retried on its own with
backoff and then dead-lettered, a database outage waited out on the same records (G8).

What it reports is what committed: a delivery's offset moves on (its partition's
:class:`PartitionProgress`) only once its transaction committed, it was absorbed as a duplicate,
or it was dead-lettered (G6).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic

import structlog
from aiokafka.structs import ConsumerRecord, TopicPartition
from tenacity import (
    AsyncRetrying,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from outboxkit.inbox.exceptions import InboxStorageUnavailableError, InboxTransactionTooLongError
from outboxkit.inbox.handlers import TX
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.progress import PartitionProgress
from outboxkit.inbox.settings import InboxSettings
from outboxkit.inbox.store import BatchOutcome, Delivery, InboxStore

logger = structlog.get_logger("outboxkit.inbox")

#: Dead-letters a delivery whose handler kept failing: (record, reason, error, progress).
DeadLettering = Callable[
    [ConsumerRecord[bytes, bytes], str, BaseException, PartitionProgress], Awaitable[None]
]


@dataclass
class TransactionHealth:
    """What the worker's health reports of the store's transactions."""

    #: ``time.time()`` of the last transaction that committed.
    last_progress: float | None = None
    last_error: str | None = None
    #: ``time.monotonic()`` the first transaction that failed for the database began, until
    #: one commits (or the database answers again).
    unavailable_since: float | None = None

    @property
    def database_available(self) -> bool:
        return self.unavailable_since is None

    def unavailable_for(self) -> float | None:
        """Seconds since the first transaction of the current outage began; None without one."""
        since = self.unavailable_since
        return None if since is None else time.monotonic() - since

    def available(self) -> None:
        """The database answered: the outage, if any, is over."""
        self.unavailable_since = None


#: The first pause before retrying a transaction the database did not answer; each further
#: failure in a row doubles it, up to ``retry_backoff_max``.
FIRST_OUTAGE_PAUSE = 0.05


def outage_pause(failures: int, longest: float) -> float:
    """Seconds to wait before the next try after ``failures`` transactions in a row the
    database did not answer. Short at first: a try during an outage mostly waits for a
    connection (the pool hands one out as soon as the database answers again), so a long
    fixed pause would only hold back the first try after it does."""
    return min(longest, FIRST_OUTAGE_PAUSE * 2.0 ** max(failures - 1, 0))


class TransactionRunner(Generic[TX]):
    """Runs the deliveries of inbox ``name`` in ``store``'s transactions. ``pause`` waits the
    seconds it is given before a retry after an outage (:func:`outage_pause`; it raises when
    the worker stops); ``dead_letter`` takes a delivery whose handler failed
    ``settings.handler_attempts`` times."""

    def __init__(
        self,
        name: str,
        settings: InboxSettings,
        store: InboxStore[TX],
        *,
        metrics: InboxMetrics,
        pause: Callable[[float], Awaitable[None]],
        dead_letter: DeadLettering,
        health: TransactionHealth | None = None,
    ) -> None:
        self._name = name
        self._store = store
        self._attempts = settings.handler_attempts
        self._backoff_max = settings.retry_backoff_max
        self._metrics = metrics
        self._pause = pause
        self._dead_letter = dead_letter
        self.health = health or TransactionHealth()
        self._log = logger.bind(inbox=name)

    async def run(
        self, tp: TopicPartition, batch: list[Delivery[TX]], progress: PartitionProgress
    ) -> None:
        """Commit ``batch`` in one transaction; a delivery whose handler raises goes through the
        one-record path (retries with backoff, then the dead-letter topic). A transaction the
        database aborted for outliving its time limit is split in halves, down to one record,
        whose handler then counts as failing (G8). Empties ``batch``."""
        size = len(batch)
        outages = 0
        while batch:
            began = time.monotonic()
            started = time.perf_counter()
            chunk = batch[:size]
            try:
                outcome = await self._store.process_batch(self._name, chunk)
            except InboxTransactionTooLongError as exc:
                if len(chunk) == 1:
                    outcome = BatchOutcome(failed=(0, exc))
                else:
                    size = len(chunk) // 2
                    self._metrics.splits.labels(self._name).inc()
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
                self._storage_unavailable(exc, progress, began)
                outages += 1
                pause = outage_pause(outages, self._backoff_max)
                self._log.warning("database unavailable, pausing", error=str(exc), pause=pause)
                await self._pause(pause)
                continue
            outages = 0
            self._took_effect()
            done, handled = len(outcome.ran), sum(outcome.ran)
            if done:
                self._metrics.handler_seconds.labels(self._name).observe(
                    (time.perf_counter() - started) / done
                )
                self._metrics.handled.labels(self._name).inc(handled)
                if done > handled:
                    self._metrics.duplicates.labels(self._name).inc(done - handled)
                progress.advance(batch[done - 1].offset + 1)
            if outcome.failed is not None:
                delivery = batch[done]
                await self._run_alone(delivery, progress)
                progress.advance(delivery.offset + 1)
                done += 1
            del batch[:done]

    async def _run_alone(self, delivery: Delivery[TX], progress: PartitionProgress) -> None:
        """One delivery on its own: retries a raising handler with backoff, then dead-letters."""
        event = delivery.event
        log = self._log.bind(event_id=str(event.id), event_type=event.event_type)
        outages = 0
        while True:
            began = time.monotonic()
            try:
                await self._handle(delivery, log)
                self._took_effect()
                return
            except InboxStorageUnavailableError as exc:
                # Not the record's fault: keep the position and try the same record again.
                self._storage_unavailable(exc, progress, began)
                outages += 1
                pause = outage_pause(outages, self._backoff_max)
                log.warning("database unavailable, pausing", error=str(exc), pause=pause)
                await self._pause(pause)
            except Exception as exc:  # the handler kept raising
                self.health.last_error = f"handler failed: {exc!r}"
                progress.error(self.health.last_error)
                log.error("handler failed, dead-lettering", error=repr(exc))
                assert delivery.record is not None
                await self._dead_letter(delivery.record, "handler_failed", exc, progress)
                return

    async def _handle(
        self, delivery: Delivery[TX], log: structlog.typing.FilteringBoundLogger
    ) -> None:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential_jitter(multiplier=0.05, max=self._backoff_max, jitter=0.2),
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
                outcome = await self._store.process_batch(self._name, [delivery])
                if outcome.failed is not None:
                    raise outcome.failed[1]
                [ran] = outcome.ran
                self._metrics.handler_seconds.labels(self._name).observe(
                    time.perf_counter() - started
                )
        if ran:
            self._metrics.handled.labels(self._name).inc()
        else:
            self._metrics.duplicates.labels(self._name).inc()
            log.debug("duplicate absorbed")

    def _took_effect(self) -> None:
        self.health.available()
        self.health.last_progress = time.time()

    def _storage_unavailable(
        self, exc: InboxStorageUnavailableError, progress: PartitionProgress, began: float
    ) -> None:
        self._metrics.storage_errors.labels(self._name).inc()
        if self.health.unavailable_since is None:
            self.health.unavailable_since = began
        self.health.last_error = str(exc)
        progress.error(str(exc))
