"""A block worker's stage clock: how long each stage of its cycle took, and the cycle's pace.

Every stage (:data:`~outboxkit.relay.metrics.STAGES`: wakeup, pace, claim, settle, send, commit,
confirm, fence, init) is observed into ``outboxkit_relay_stage_seconds``; one that takes
``slow_after`` or more is logged, unless it is a wait by design (pace, wakeup). The stage
running now and since when are what the relay's watch reads to say which stage runs long.

The pace is batching by time: a cycle starts at most every ``batch_interval`` unless the last
one found a backlog, so under load a transaction carries what was committed meanwhile, and an
idle relay sends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import structlog

from outboxkit.relay.metrics import STAGES, RelayMetrics
from outboxkit.relay.publisher import StageTimes
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.retry import pause
from outboxkit.relay.settings import RelaySettings

logger = structlog.get_logger("outboxkit.relay")

#: Stages that wait by design: never "slow".
_WAITS = frozenset({"pace", "wakeup"})


@dataclass(eq=False)
class StageClock:
    """Times the stages of one block's cycles and paces them."""

    metrics: RelayMetrics
    tps: Sequence[TopicPartition]
    settings: RelaySettings  #: slow_after, batch_interval
    stop: asyncio.Event
    _name: str | None = field(default=None, init=False)
    _since: float = field(default=0.0, init=False)
    _publishing: StageTimes | None = field(default=None, init=False)
    _cycle_started: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        # The hot path's metric children, looked up once (labels() takes a lock each time).
        self._stages = {name: self.metrics.stage.labels(name) for name in STAGES}

    @property
    def current(self) -> str | None:
        """The stage running now, if any."""
        if self._publishing is not None:
            return self._publishing.current
        return self._name

    @property
    def since(self) -> float:
        """When :attr:`current` began (monotonic)."""
        if self._publishing is not None:
            return self._publishing.since
        return self._since

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block inside as stage ``name``."""
        self._name, self._since = name, time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - self._since
            self._name = None
            self.record(name, took)

    @contextlib.contextmanager
    def publishing(self) -> Iterator[StageTimes]:
        """Time one publish: the publisher fills the :class:`StageTimes` it is given as it goes
        (send, then commit); a publish that failed or timed out counts until it ended."""
        times = self._publishing = StageTimes()
        try:
            yield times
        finally:
            self._publishing = None
            if times.current == "send":  # failed or timed out while sending
                times.send = time.monotonic() - times.since
            self.record("send", times.send)
            if times.current == "commit":
                self.record("commit", times.commit or time.monotonic() - times.since)

    def record(self, name: str, seconds: float) -> None:
        """Observe ``seconds`` of stage ``name``; log it if it was slow."""
        self._stages[name].observe(seconds)
        if seconds >= self.settings.slow_after and name not in _WAITS:
            logger.warning(
                "slow relay stage",
                stage=name,
                seconds=round(seconds, 3),
                partitions=[str(tp) for tp in self.tps],
            )

    async def pace(self, *, backlog: bool) -> None:
        """Wait until ``batch_interval`` has passed since the last cycle began (not after a
        cycle that found a backlog), or until stopped."""
        if backlog:
            return
        delay = self._cycle_started + self.settings.batch_interval - time.perf_counter()
        if delay > 0:
            with self.stage("pace"):
                await pause(delay, self.stop)

    def begin_cycle(self, woken_at: float | None) -> None:
        """A cycle begins: the pace counts from now; a writer's wake-up (``woken_at``,
        :func:`time.perf_counter`) took until now to reach it."""
        self._cycle_started = time.perf_counter()
        if woken_at is not None:
            self.record("wakeup", self._cycle_started - woken_at)
