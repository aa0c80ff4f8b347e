"""What the relay and inbox processes logged while a fault lasted: the excerpt a failed check
prints beside its table, so that a gap over its bound says where the time went (a stage that
ran long, a retried error, a rejoin) from the report alone, without the run's log directory
(gone with the CI machine).

The workers log in structlog's console format (``<ISO time> [<level>] <event> ...``) at INFO,
aiokafka's reconnect storms silenced (:func:`outboxkit.core.logs.configure_logging`), so the
lines of one fault are few; a line repeated (the same event and fields) is shown once, with how
many times it came."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime

#: Lines shown per process and fault, at most (the earliest: where a stall began).
LIMIT = 12


def excerpt(
    name: str, text: str, start: float, end: float, *, before: float = 1.0, limit: int = LIMIT
) -> list[str]:
    """The lines of ``text`` (one process's log) stamped from ``before`` seconds before
    ``start`` (a fault's, Unix seconds) to ``end``, each prefixed with ``name`` and its time
    relative to ``start``; repeats folded into their first, with a count; at most ``limit``,
    then how many were left out."""
    first: dict[str, float] = {}  # line without its time → seconds from start, first seen
    count: Counter[str] = Counter()
    for line in text.splitlines():
        at = _stamp(line)
        if at is None or not start - before <= at <= end:
            continue
        body = line.split(" ", 1)[1].strip()
        first.setdefault(body, at - start)
        count[body] += 1
    out = [
        f"{name} {offset:+.1f} s: {body}" + (f" ({count[body]} times)" if count[body] > 1 else "")
        for body, offset in first.items()
    ]
    if len(out) > limit:
        out = [*out[:limit], f"{name}: {len(out) - limit} more lines"]
    return out


def excerpts(
    logs: Iterable[tuple[str, str]], start: float, end: float, *, before: float = 1.0
) -> tuple[str, ...]:
    """:func:`excerpt` of each ``(name, text)``, in that order."""
    return tuple(
        line for name, text in logs for line in excerpt(name, text, start, end, before=before)
    )


def _stamp(line: str) -> float | None:
    head = line.split(" ", 1)[0]
    if not head[:4].isdigit():
        return None  # a traceback's or a wrapped field's continuation
    try:
        return datetime.fromisoformat(head).timestamp()
    except ValueError:
        return None
