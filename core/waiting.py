"""Waiting on an :class:`asyncio.Event` for at most a while: the one shape behind every pause a
worker makes — a retry's backoff cut short by a stop, a wait for a wake-up or the sweep, a
periodic check brought forward by an assignment."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` was set within ``seconds`` (returns as soon as it is)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
