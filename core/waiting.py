"""Waiting on an :class:`asyncio.Event` for at most a while: the one shape behind every pause a
worker makes — a retry's backoff cut short by a stop, a wait for a wake-up or the sweep, a
periodic check brought forward by an assignment. And the pause between the turns of a loop that
runs until it is cancelled, which must not outlive its cancellation.

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
