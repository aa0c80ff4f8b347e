"""Stepping aside: a worker that cannot reach its database leaves its consumer group, so that the
workers that can take its partitions, and joins again once the database answers. One part for
the relay and the inbox worker.

Nothing else would move the partitions: a worker whose database link is cut or half-open still
heartbeats, so Kafka keeps its partitions with it. Once the database has answered nothing for
``bound`` seconds (and, where the worker says so, it has made no progress for as long: a relay
that still publishes is no reason to leave), :class:`StepAside` leaves the group; the first
answer makes it join again. Leaving is safe at any moment: a worker out of its group publishes
or handles nothing, a relay's in-flight sends are fenced by the new owners, an inbox's effects
are absorbed by its dedupe records. A database that no worker can reach takes them all out, and
its first answer brings each back.

How the worker learns that its database answers again is its own: the relay keeps measuring its
backlog (:class:`~outboxkit.relay.side_tasks.BacklogMonitor`), the inbox pings its store.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from outboxkit.core.waiting import sleep_unless_cancelled

__all__ = ["Group", "StepAside"]

#: A worker's :meth:`StepAside.run` looks this often (seconds).
_CHECK_EVERY = 1.0


class Group(Protocol):
    """The consumer-group membership stepping aside drives."""

    async def step_aside(self) -> None:
        """Leave the group; publish or handle nothing until :meth:`step_in`."""

    def step_in(self) -> None:
        """Join the group again."""


@dataclass
class StepAside:
    """Leaves ``group`` once the database has not answered for ``bound`` seconds (0: never), and
    joins again at its first answer, saying so each time in ``log`` with who takes the
    partitions meanwhile (``others``) and setting ``gauge`` (1 while out)."""

    #: Seconds the database has not answered (None: it answers).
    unanswered_for: Callable[[], float | None]
    group: Group
    bound: float
    #: Who takes the partitions meanwhile, for the log: "the other relays publish this relay's
    #: partitions".
    others: str
    #: The gauge of this worker's state: 1 while out, 0 after.
    gauge: Callable[[float], None]
    log: Any  # a structlog logger
    #: Seconds since the worker last made progress (None: never). One that progressed within
    #: ``bound`` stays.
    since_progress: Callable[[], float | None] = lambda: None
    #: Monotonic time this worker left its group, while it is out.
    aside_since: float | None = field(default=None, init=False)

    def aside_for(self) -> float | None:
        """Seconds this worker has been out of its group, or None."""
        return None if self.aside_since is None else time.monotonic() - self.aside_since

    def due(self) -> bool:
        """Whether the worker should leave its group now."""
        if self.aside_since is not None or self.bound <= 0:
            return False
        unanswered = self.unanswered_for()
        idle = self.since_progress()
        return (
            unanswered is not None
            and unanswered >= self.bound
            and (idle is None or idle >= self.bound)
        )

    async def check(self) -> None:
        """Leave the group if :meth:`due`; join it again if out and the database answers."""
        if self.aside_since is not None:
            if self.unanswered_for() is None:
                self.log.info(
                    "the database answers again: rejoining the group",
                    after=round(time.monotonic() - self.aside_since, 1),
                )
                self.aside_since = None
                self.gauge(0)
                self.group.step_in()
            return
        if not self.due():
            return
        self.log.warning(
            f"the database does not answer: leaving the group so that {self.others}",
            unanswered_for=round(self.unanswered_for() or 0.0, 1),
        )
        self.aside_since = time.monotonic()
        self.gauge(1)
        await self.group.step_aside()

    async def run(self) -> None:
        """Check every second, until cancelled."""
        while True:
            await sleep_unless_cancelled(_CHECK_EVERY)
            await self.check()
