"""What a relay says when it runs degraded: publishing on its sweep instead of on commit.

A relay that writers no longer wake still publishes everything (the sweep reads every idle
partition each ``sweep_interval``), so nothing else would show it: it is merely slow, by up to
a sweep interval per record. Two things give it away, both seen by a block's
:class:`~outboxkit.relay.gate.IdleGate`:

- its idle declaration is gone: the gate declares it again at each sweep and after every
  reconnect of the listener, and the storage says whether it was missing. On PostgreSQL the
  declarations live in an unlogged table (``outboxkit.relay_waiting``), which a crash restart
  empties and a promoted standby never had;
- its sweep finds records that no wake-up announced, :data:`UNANNOUNCED_EPISODE` sweeps in a row
  (a single one can be a record committed as the sweep began, its wake-up on the way).

Either begins an *episode*, which lasts until a wake-up announces a partition again: one
warning when it begins, one line when it ends, the gauge ``outboxkit_relay_wakeups_missed`` at
1 meanwhile (the shipped alert ``OutboxkitRelayWakeupsMissed``), and ``/healthz`` says for how
long (``wakeups_missed_for``).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

import structlog

from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import TopicPartition

logger = structlog.get_logger("outboxkit.relay")

#: Sweeps in a row of one block that found records no wake-up announced before an episode
#: begins.
UNANNOUNCED_EPISODE = 2

__all__ = ["UNANNOUNCED_EPISODE", "MissedWakeups"]


@dataclass
class MissedWakeups:
    """The episodes of one relay in which writers did not wake it (module docstring)."""

    metrics: RelayMetrics
    #: Monotonic time the current episode began; None outside one.
    since: float | None = field(default=None, init=False)

    def missed_for(self) -> float | None:
        """Seconds since the current episode began; None outside one."""
        return None if self.since is None else time.monotonic() - self.since

    def declaration_lost(self, tps: Collection[TopicPartition]) -> None:
        """``tps`` were declared waiting, and the storage no longer had it (declared again)."""
        self.metrics.declarations_lost.inc(len(tps))
        self._begin(
            "writers did not wake this relay: its idle declarations were gone (a database "
            "restart or failover loses them); declared again",
            tps,
        )

    def unannounced(self, tps: Collection[TopicPartition], streak: int) -> None:
        """A sweep of ``tps`` found records no wake-up announced, the ``streak``-th in a
        row."""
        for topic in {tp.topic for tp in tps}:
            self.metrics.unannounced.labels(topic).inc()
        if streak >= UNANNOUNCED_EPISODE:
            self._begin(
                "writers do not wake this relay: its sweeps find records no wake-up announced, "
                "so it publishes every OUTBOXKIT_SWEEP_INTERVAL instead of on commit",
                tps,
            )

    def announced(self) -> None:
        """A wake-up announced a partition: wake-ups work (again)."""
        if self.since is None:
            return
        logger.info("writers wake this relay again", after=round(time.monotonic() - self.since, 1))
        self.since = None
        self.metrics.wakeups_missed.set(0)

    def _begin(self, message: str, tps: Collection[TopicPartition]) -> None:
        if self.since is not None:
            return
        self.since = time.monotonic()
        self.metrics.wakeups_missed.set(1)
        logger.warning(message, partitions=sorted(str(tp) for tp in tps))
