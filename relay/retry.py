"""What a block worker retries, and how: exponential backoff with jitter (tenacity), capped at
``retry_backoff_max`` and cut short when the worker is asked to stop.

A retriable error is one that may pass by itself: the database or Kafka unreachable, records
Kafka rejected that have attempts left, a membership the group has not confirmed yet. Anything
else is a bug or data nothing foresaw: it ends the worker, and the relay restarts it with its own
backoff (``partition worker failed unexpectedly``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from outboxkit.core.waiting import wait_set
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.publisher import describe
from outboxkit.relay.settings import RelaySettings


class RetryLater(Exception):
    """Records were rejected, or a producer may not start yet: back off, then try again."""


RETRIABLE = (StorageUnavailableError, KafkaError, OSError, RetryLater)


async def pause(seconds: float, stop: asyncio.Event | None) -> None:
    """``seconds``, or until ``stop`` is set."""
    await wait_set(stop or asyncio.Event(), seconds)


def retrying(
    settings: RelaySettings,
    log: structlog.typing.FilteringBoundLogger,
    stop: asyncio.Event | None,
    on_error: Callable[[BaseException], None],
) -> AsyncRetrying:
    """Backoff for retriable errors (capped at ``retry_backoff_max``), cut short by ``stop``."""

    async def sleep(seconds: float) -> None:
        await pause(seconds, stop)

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
