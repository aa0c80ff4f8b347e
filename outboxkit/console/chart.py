"""The overview's chart, drawn on the server as SVG: the outbox's pending records and the
inboxes' lag over the last minutes (no script, no library: the page shows it without
JavaScript, and the Content-Security-Policy allows no inline style, so it is drawn with
attributes and classes of the console's stylesheet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from outboxkit.console.overview import Sample

__all__ = ["Chart", "chart"]

WIDTH = 1200
HEIGHT = 160
#: Room for the axis labels.
LEFT = 56
BOTTOM = 20
#: The shortest span the x axis shows (the chart of a console that just started).
MIN_SPAN = 60.0


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    #: ``points`` attributes of the two polylines ("x,y x,y …"), empty with fewer than 2 samples.
    backlog: str
    lag: str
    top: int
    #: Minutes the x axis spans: the history kept, or less when the console started since.
    minutes: float
    #: The latest values, for the legend.
    last_backlog: int
    last_lag: int
    left: int = LEFT
    bottom: int = BOTTOM


def chart(samples: Sequence[Sample], window: float) -> Chart:
    """Both lines over the last ``window`` seconds (less while the samples span less, down to
    a minute), on one scale from 0 to the top value (a round number at or above the
    largest)."""
    last = samples[-1] if samples else None
    if last is not None:
        window = min(window, max(last.at - samples[0].at, MIN_SPAN))
    top = _round_up(max([1, *(s.backlog for s in samples), *(s.lag for s in samples)]))
    end = last.at if last else 0.0
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM

    def line(values: list[tuple[float, int]]) -> str:
        if len(values) < 2:
            return ""
        return " ".join(
            f"{LEFT + plot_w * (1 - min(end - at, window) / window):.1f},"
            f"{plot_h * (1 - value / top):.1f}"
            for at, value in values
        )

    return Chart(
        width=WIDTH,
        height=HEIGHT,
        backlog=line([(s.at, s.backlog) for s in samples]),
        lag=line([(s.at, s.lag) for s in samples]),
        top=top,
        minutes=window / 60,
        last_backlog=last.backlog if last else 0,
        last_lag=last.lag if last else 0,
    )


def _round_up(value: int) -> int:
    """1, 2 or 5 times a power of ten, at or above ``value``."""
    magnitude = 1
    while True:
        for step in (1, 2, 5):
            if step * magnitude >= value:
                return step * magnitude
        magnitude *= 10
