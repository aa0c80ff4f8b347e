"""Back to full speed after a fault (G10): a window of delays before the fault, and the first
window of the same length after its heal that is as fast again.

The guarantees can all hold while a system is much slower after a fault than before it: a relay
that writers no longer wake still publishes everything, on its sweep (a PostgreSQL failover
did that, silently). So every fault of :class:`~tests.failover.harness.FailoverRun` is measured
against itself:

- the **baseline**: the events committed in the :data:`WINDOW` seconds before the fault began,
  their commit→Kafka delays (and Kafka→effect, the inbox's), p50 and p99, as of the fault's
  start (an event still in flight then counts by its age: it is not the fault's victim);
- **back**: the earliest window of the same length that starts after the heal (the server is
  back, the link healed: ``fault.healed``) whose p99s are within :data:`FACTOR` times the
  baseline's, or under a floor (noise on a loaded 2-core machine: :data:`FLOOR` under load,
  :data:`QUIET_FLOOR` when quiet), and, quiet, whose p50 is too (floor :data:`QUIET_P50`). It must
  start within the fault's stated bound of the heal (``back_within``). Candidate windows start
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
#: A window is back when its p99s are within this factor of the baseline's…
FACTOR = 2.0
#: …or under this floor (seconds), whatever the baseline, at a busy load: a loaded 2-core
#: machine's noise — a three-broker cluster's p99 under 100 events/s is often over half a
#: second there. Seconds-long stalls (a partition nobody publishes, a worker idle on dead
#: connections) are well over it.
FLOOR = 1.0
#: …and at a quiet load: well under a test relay's sweep interval (1 s), so a relay woken only
#: by its sweep, whose delays spread evenly over the interval, is never within it.
QUIET_FLOOR = 0.25
#: A quiet window is back only with its commit→Kafka p50 within :data:`FACTOR` times the
#: baseline's, or under this (seconds), too: a relay woken on commit publishes within tens of
#: milliseconds; a sweep-only relay's p50 is half its sweep interval (0.5 s in the tests, five
#: times this), and a relay that waits 100 ms or more before it publishes is over it. Not lower:
#: on a CI machine running other suites' brokers and Spark beside this one, a relay woken on
#: commit measured p50 41 ms before a crash restart and 89 ms after it, every p99 within bounds.
QUIET_P50 = 0.1
#: Candidate windows after the heal start this far apart (seconds).
STEP = 0.25
#: Events per second of a quiet phase.
QUIET_RATE = 10.0

__all__ = [
    "FACTOR",
    "FLOOR",
    "QUIET_FLOOR",
    "QUIET_P50",
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

    def within(self, baseline: Window, load: str = "busy") -> bool:
        """As fast as ``baseline``, give or take :data:`FACTOR` (or under the load's floor);
        quiet, its p50 too (or under :data:`QUIET_P50`)."""
        floor = QUIET_FLOOR if load == "quiet" else FLOOR
        return (
            self.events > 0
            and self.delivery_p99 <= max(FACTOR * baseline.delivery_p99, floor)
            and self.inbox_p99 <= max(FACTOR * baseline.inbox_p99, floor)
            and (
                load != "quiet"
                or self.delivery_p50 <= max(FACTOR * baseline.delivery_p50, QUIET_P50)
            )
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
    timeline: Timeline,
    baseline: Window,
    *,
    healed: float,
    until: float,
    now: float,
    load: str = "busy",
) -> Window | None:
    """The earliest window starting at or after ``healed`` (every :data:`STEP`), and ending
    by ``until`` and by ``now``, that is within ``baseline``; None if none is yet."""
    commits = _commits_from(timeline, healed)
    start = healed
    while start + WINDOW <= min(until, now):
        window = _window(timeline, commits, start, now)
        if window.within(baseline, load):
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
    # As of ``now``: an event on Kafka (or in effect) only later is late by its age then.
    arrived = {e: min(arrivals[e].at, now) if e in arrivals else now for _, e in events}
    delivery = sorted(arrived[e] - at for at, e in events)
    inbox: list[float] = []
    if effect_at is not None:
        inbox = sorted(
            max(0.0, min(effect_at.get(e, now), now) - arrived[e])
            for _, e in events
            if arrived[e] < now
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
