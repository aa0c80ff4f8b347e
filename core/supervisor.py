"""A worker's side tasks, supervised: if one ends, the worker stops loudly.

Beside its main loop a worker runs tasks that never end by themselves. The relay's: the group
membership, the wake-up dispatch, the backlog measure, the watch on stages, the purge, the check
for departed relays (:mod:`outboxkit.relay.side_tasks`, :mod:`outboxkit.relay.departed`). The
inbox's: the periodic offset commit and the purge of old dedupe records. One that ends, by an
error or not, would leave the worker running half-blind, so :class:`Supervisor` raises instead.
Stopping, :func:`await_cancelled` waits for the cancelled tasks, but not forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog

logger = structlog.get_logger("outboxkit")

#: Stopping, a cancelled task has this long to finish before it is left behind (logged).
_CANCEL_GRACE = 5.0

__all__ = ["Supervisor", "await_cancelled", "unless_stopped"]


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
