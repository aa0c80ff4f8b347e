"""A worker's side tasks, supervised: if one ends, the worker stops loudly.

Beside its main loop a worker runs tasks that never end by themselves. The relay's: the group
membership, the wake-up dispatch, the backlog measure, the watch on stages, the purge, the check
for departed relays (:mod:`outboxkit.relay.side_tasks`, :mod:`outboxkit.relay.departed`). The
inbox's: the periodic offset commit and the purge of old dedupe records. One that ends, by an
error or not, would leave the worker running half-blind, so :class:`Supervisor` raises instead.
Stopping, it waits for the cancelled tasks, but not forever
(:func:`~outboxkit.core.waiting.await_cancelled`, with the other cancellation helpers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from outboxkit.core.waiting import await_cancelled

__all__ = ["Supervisor"]


class Supervisor:
    """Named side tasks that must run as long as their ``worker`` (``relay``, ``inbox``) does."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(work, name=name))

    def check(self) -> None:
        """For a loop that polls: if a side task has ended, raise its exception, or a
        :class:`RuntimeError` naming it."""
        for task in self._tasks:
            if task.done():
                self._raise_ended(task)

    async def wait(self, stopping: asyncio.Event) -> None:
        """Return once ``stopping`` is set; if a side task ends first, raise as :meth:`check`."""
        stopped = asyncio.create_task(stopping.wait(), name="stop")
        try:
            done, _ = await asyncio.wait(
                [stopped, *self._tasks], return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopped.cancel()
            await await_cancelled([stopped])
        for task in done:
            if task is not stopped:
                self._raise_ended(task)

    def _raise_ended(self, task: asyncio.Task[Any]) -> None:
        task.result()
        raise RuntimeError(f"{self.worker} task {task.get_name()} ended unexpectedly")

    async def cancel(self) -> None:
        """Cancel every side task and wait for them (:func:`await_cancelled`)."""
        for task in self._tasks:
            task.cancel()
        await await_cancelled(self._tasks)
