"""Back to full speed after a fault (G10): a window of delays before the fault, and the first
window of the same length after its heal that is as fast again.

The guarantees can all hold while a system is much slower after a fault than before it: a relay
that writers no longer wake still publishes everything, on its sweep (a PostgreSQL failover
did that, silently). So every fault of :class:`~tests.failover.harness.FailoverRun` is measured
against itself:

- the **baseline**: the events committed in the :data:`WINDOW` seconds before the fault began,
  their commit→Kafka delays (and Kafka→effect, the inbox's), p50 and p99;
- **back**: the earliest window of the same length that starts after the heal (the server is
  back, the link healed: ``fault.healed``) whose p50 and p99s are within :data:`FACTOR` times
  the baseline's, or under :data:`P50_FLOOR` and :data:`FLOOR` (noise on a loaded 2-core
  machine). It must start within
  the fault's stated bound of the heal (``back_within``). Candidate windows start
  :data:`STEP` apart. An event not on Kafka yet counts as late by its age.

A fault can be run at a quiet load (``load="quiet"``: :data:`QUIET_RATE` events per second,
baseline and window both quiet): a relay that publishes on its sweep is fast under load —
every cycle reads everything anyway — and slow only when quiet.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from tests.failover.arrivals import Arrival

#: Seconds of events one window holds (at 100 events/s, 300; quiet, 30).
WINDOW = 3.0
#: A window is back when its p50 and p99s are within this factor of the baseline's…
FACTOR = 2.0
#: …or under these (seconds), whatever the baseline: a loaded 2-core machine's noise. Well
#: under a test relay's sweep interval (1 s): a relay woken only by its sweep, whose delays
#: spread evenly over the interval, is never within them.
FLOOR = 0.25
P50_FLOOR = 0.05
#: Candidate windows after the heal start this far apart (seconds).
STEP = 0.25
#: Events per second of a quiet phase.
QUIET_RATE = 10.0

__all__ = [
    "FACTOR",
    "FLOOR",
    "P50_FLOOR",
    "QUIET_RATE",
    "STEP",
    "WINDOW",
    "Timeline",
    "Window",
    "closest",
    "first_back",
    "measure",
]


@dataclass(frozen=True)
class Window:
    """The delays of the events committed in ``[start, start + WINDOW)``."""

    start: float
    events: int
    #: commit→Kafka (until a read_committed reader got it), seconds.
    delivery_p50: float
    delivery_p99: float
    #: Kafka→the inbox's effect, seconds (0 when effects are not measured).
    inbox_p99: float = 0.0

    def within(self, baseline: Window) -> bool:
        """As fast as ``baseline``, give or take :data:`FACTOR` (or under :data:`FLOOR`)."""
        return (
            self.events > 0
            and self.delivery_p50 <= max(FACTOR * baseline.delivery_p50, P50_FLOOR)
            and self.delivery_p99 <= max(FACTOR * baseline.delivery_p99, FLOOR)
            and self.inbox_p99 <= max(FACTOR * baseline.inbox_p99, FLOOR)
        )

    def describe(self) -> str:
        text = f"p50 {self.delivery_p50 * 1000:.0f} ms, p99 {self.delivery_p99 * 1000:.0f} ms"
        if self.inbox_p99:
            text += f", inbox p99 {self.inbox_p99 * 1000:.0f} ms"
        return f"{text} ({self.events} events)"


@dataclass(frozen=True)
class Timeline:
    """When each event was committed, reached Kafka and (if measured) took effect."""

    committed_at: Mapping[UUID, float]
    arrivals: Mapping[UUID, Arrival]
    effect_at: Mapping[UUID, float] | None = None


def measure(timeline: Timeline, start: float, now: float) -> Window:
    """The window of events committed in ``[start, start + WINDOW)``, as of ``now`` (an event
    not on Kafka, or not taken effect, is late by its age)."""
    return _window(timeline, _commits_from(timeline, start), start, now)


def first_back(
    timeline: Timeline, baseline: Window, *, healed: float, until: float, now: float
) -> Window | None:
    """The earliest window starting at or after ``healed`` (every :data:`STEP`), and ending
    by ``until`` and by ``now``, that is within ``baseline``; None if none is yet."""
    commits = _commits_from(timeline, healed)
    start = healed
    while start + WINDOW <= min(until, now):
        window = _window(timeline, commits, start, now)
        if window.within(baseline):
            return window
        start += STEP
    return None


def closest(
    timeline: Timeline, baseline: Window, *, healed: float, until: float, now: float
) -> Window | None:
    """Of the windows :func:`first_back` looks at, the one with the lowest p99 over the
    baseline's (what a fault that was not back came closest to)."""
    commits = _commits_from(timeline, healed)
    best: Window | None = None
    start = healed
    while start + WINDOW <= min(until, now):
        window = _window(timeline, commits, start, now)
        if window.events and (best is None or window.delivery_p99 < best.delivery_p99):
            best = window
        start += STEP
    return best


def _commits_from(timeline: Timeline, start: float) -> list[tuple[float, UUID]]:
    """(commit time, event) of the events committed from ``start`` on, in commit order."""
    return sorted((at, e) for e, at in list(timeline.committed_at.items()) if at >= start)


def _window(
    timeline: Timeline, commits: list[tuple[float, UUID]], start: float, now: float
) -> Window:
    low = bisect.bisect_left(commits, start, key=lambda c: c[0])
    high = bisect.bisect_left(commits, start + WINDOW, key=lambda c: c[0])
    events = commits[low:high]
    arrivals, effect_at = timeline.arrivals, timeline.effect_at
    delivery = sorted((arrivals[e].at if e in arrivals else now) - at for at, e in events)
    inbox: list[float] = []
    if effect_at is not None:
        inbox = sorted(
            max(0.0, effect_at.get(e, now) - arrivals[e].at) for _, e in events if e in arrivals
        )
    return Window(
        start,
        len(events),
        delivery_p50=_quantile(delivery, 0.5),
        delivery_p99=_quantile(delivery, 0.99),
        inbox_p99=_quantile(inbox, 0.99),
    )


def _quantile(values: list[float], q: float) -> float:
    """``values`` sorted; 0 when empty."""
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0.0
