"""Waiting and cancelling, the one home of both. Waiting on an :class:`asyncio.Event` for at most
a while: the one shape behind every pause a worker makes — a retry's backoff cut short by a
stop, a wait for a wake-up or the sweep, a periodic check brought forward by an assignment. The
pause between the turns of a loop that runs until it is cancelled, which must not outlive its
cancellation. And cancelling: work run until a stop (:func:`unless_stopped`), and the wait for
cancelled tasks that gives up on one that ignores it (:func:`await_cancelled`).

On Python 3.11, ``asyncio.wait_for`` loses a cancellation that arrives just as the awaitable it
wraps completes (CPython gh-86296, fixed in 3.12 and not backported). pymongo sends every
command through ``wait_for`` (``network_layer.async_sendall``), so a task cancelled at that
instant runs on as if it had never been asked: a side task keeps polling, a change stream keeps
reading, and stopping the worker waits for them until its grace runs out. A loop that runs until
cancelled therefore checks at each turn (:func:`raise_if_cancelled`, or
:func:`sleep_unless_cancelled` for its pause): its task's pending cancellation request is still
counted (``Task.cancelling()``), so a lost one is raised again there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog

logger = structlog.get_logger("outboxkit")

__all__ = [
    "await_cancelled",
    "raise_if_cancelled",
    "sleep_unless_cancelled",
    "unless_stopped",
    "wait_set",
]


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` was set within ``seconds`` (returns as soon as it is)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


def raise_if_cancelled() -> None:
    """Raise :class:`asyncio.CancelledError` if this task was asked to stop and is still
    running: a library call lost the cancellation (above)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def sleep_unless_cancelled(seconds: float) -> None:
    """The pause between two turns of a loop that runs until cancelled:
    :func:`raise_if_cancelled`, then ``seconds``."""
    raise_if_cancelled()
    await asyncio.sleep(seconds)


#: Stopping, a cancelled task has this long to finish before it is left behind (logged).
_CANCEL_GRACE = 5.0


async def await_cancelled(
    tasks: Sequence[asyncio.Task[Any]], *, grace: float = _CANCEL_GRACE
) -> None:
    """Wait for ``tasks`` (ending or cancelled) to finish, but not forever: one that ignores
    its cancellation (a library call stuck on the network) for ``grace`` seconds is logged with
    where it is stuck and left behind, so that stopping a worker never hangs."""
    if not tasks:
        return
    done, stuck = await asyncio.wait(tasks, timeout=grace)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: whoever cares reported it already
    for task in stuck:
        where = [f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack(limit=4)]
        logger.error(
            "task did not stop when cancelled, left behind", task=task.get_name(), at=where
        )


async def unless_stopped(stopping: asyncio.Event, work: Coroutine[Any, Any, None]) -> bool:
    """Run ``work`` until it ends or ``stopping`` is set (then cancel it): whether it ended.
    Its exception, if it raised, propagates."""
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stopping.wait(), name="stop")
    try:
        await asyncio.wait([stopped, task], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stopped):
            pending.cancel()
        await await_cancelled([task, stopped])
    if task.cancelled():
        return False
    task.result()
    return True
