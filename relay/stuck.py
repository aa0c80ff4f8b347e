"""Partitions a relay holds whose records wait while their block makes no progress, and what it
does about it: it says so, and steps aside from them.

A relay keeps its partitions for as long as its group coordinator hears its heartbeats. So a
block that cannot publish for a reason the group cannot see — the leader of one of its
partitions unreachable from this relay while the coordinator answers, a producer that hangs —
would hold its partitions' records back until the cause goes away, and nothing would tell.

A block is **stuck** when, for ``step_aside_after``, all of these held: records of its
partitions pending for that long (the last backlog measure), nothing published by it for that
long, and it kept trying (a retried error, or a stage running that long): a block that merely
waits, say behind a key a parked record holds, is not stuck. Then the relay logs one warning (per
episode), shows the partitions on ``/healthz`` (``stuck``, unhealthy) and in
``outboxkit_relay_stuck_partitions``, and rejoins its group asking not to be given them
(:meth:`~outboxkit.relay.ownership.KafkaOwnership.step_aside_from`): another relay publishes
them, fencing what this one still had in flight. The request lasts :data:`AVOID_BOUNDS` times the
bound, then is dropped (from the relay's next join): this relay may be given them again, and
if the cause has not gone, steps aside from them again. A relay given back partitions it asked
not to be given — the group's contiguous ranges leave every member one, so one cut from the
broker its blocks' transactions need can publish none — leaves the group until the request
lapses (``outboxkit_relay_stuck_partitions`` then counts what it asked to avoid), and the other
relays publish everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from outboxkit.core.waiting import sleep_unless_cancelled
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.side_tasks import RunningBlocks
from outboxkit.relay.worker import BlockWorker

logger = structlog.get_logger("outboxkit.relay")

#: How long (in bounds, ``step_aside_after``) a relay asks not to be given the partitions it
#: stepped aside from.
AVOID_BOUNDS = 10

__all__ = ["AVOID_BOUNDS", "StuckBlocks", "is_stuck"]


class Avoiding(Protocol):
    """The part of the group membership :class:`StuckBlocks` needs
    (:class:`~outboxkit.relay.engine.Ownership`)."""

    async def step_aside_from(self, partitions: frozenset[TopicPartition]) -> None: ...

    def avoid_nothing(self) -> None: ...

    async def step_aside(self) -> None: ...

    def step_in(self) -> None: ...


def is_stuck(
    worker: BlockWorker,
    backlog: dict[TopicPartition, PartitionBacklog] | None,
    bound: float,
    *,
    now: float,
    wall: float,
) -> bool:
    """Whether ``worker``'s block has been stuck for ``bound`` at ``now`` (monotonic; ``wall``
    the same moment by the wall clock, which record ages use): see the module."""
    if backlog is None:
        return False  # not measured, or the database does not answer: StepAside's business
    waiting = any(
        (b := backlog.get(tp)) is not None and b.pending and b.age(wall) >= bound
        for tp in worker.tps
    )
    progress = worker.last_success if worker.last_success is not None else worker.started_at
    trying = worker.failing_since is not None or (
        worker.stage is not None and now - worker.stage_since >= bound
    )
    return waiting and now - progress >= bound and trying


@dataclass
class StuckBlocks:
    """Finds stuck blocks every second and steps aside from their partitions (the module)."""

    blocks: RunningBlocks
    #: The last backlog measure, per partition (None: none, or it failed).
    backlog: Callable[[], dict[TopicPartition, PartitionBacklog] | None]
    group: Avoiding
    settings: RelaySettings
    metrics: RelayMetrics
    #: The partitions of the blocks stuck at the last check.
    stuck: frozenset[TopicPartition] = field(default=frozenset(), init=False)
    #: The partitions this relay asks not to be given, until ``_avoiding_until`` (monotonic).
    avoided: frozenset[TopicPartition] = field(default=frozenset(), init=False)
    _avoiding_until: float = field(default=0.0, init=False)
    #: Out of the group: given back, after asking, only partitions it could not publish.
    out: bool = field(default=False, init=False)
    _episode: float | None = field(default=None, init=False)

    def showing(self) -> frozenset[TopicPartition]:
        """What the relay's health lists as stuck: the partitions of its stuck blocks, or,
        while it is out of its group for them, those it asked not to be given."""
        return self.avoided if self.out else self.stuck

    async def run(self) -> None:
        while True:
            await sleep_unless_cancelled(1.0)
            await self.check(time.monotonic(), time.time())

    async def check(self, now: float, wall: float) -> None:
        bound = self.settings.step_aside_after
        if bound <= 0:
            return
        if self.avoided and now >= self._avoiding_until:
            self.avoided = frozenset()
            self.group.avoid_nothing()
            if self.out:
                self.out = False
                logger.info("rejoining the group to publish again")
                self.group.step_in()
        if self.out:
            self.metrics.stuck_partitions.set(len(self.avoided))
            return
        backlog = self.backlog()
        stuck = [w for w in self.blocks.workers if is_stuck(w, backlog, bound, now=now, wall=wall)]
        self.stuck = frozenset(tp for w in stuck for tp in w.tps)
        self.metrics.stuck_partitions.set(len(self.stuck))
        if not stuck:
            if self._episode is not None:
                logger.info(
                    "no partition of this relay is stuck any more",
                    after=round(now - self._episode, 1),
                )
                self._episode = None
            return
        if self._episode is None:
            self._episode = now
            worker = stuck[0]
            logger.warning(
                "partitions have records pending and no progress: stepping aside from them so "
                "that another relay publishes them",
                partitions=sorted(str(tp) for tp in self.stuck),
                seconds=round(bound, 1),
                stage=worker.stage,
                error=worker.last_error,
            )
        if self.stuck <= self.avoided:
            # Asked already, and given them back: the group's ranges could not leave them out
            # (every member gets one), so this relay publishes nothing it is given. Out of the
            # group until the request lapses, the others take every partition.
            self.out = True
            self.stuck = frozenset()
            logger.warning(
                "given back partitions it cannot publish: leaving the group so that the other "
                "relays publish them all",
                partitions=sorted(str(tp) for tp in self.avoided),
                rejoins_in=round(self._avoiding_until - now, 1),
            )
            await self.group.step_aside()
            return
        self.avoided |= self.stuck
        self._avoiding_until = now + AVOID_BOUNDS * bound
        await self.group.step_aside_from(self.avoided)
