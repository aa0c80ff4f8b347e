"""Record data made fit to show on a page: decoded, its sensitive fields masked, cut when long.

Whatever a producer wrote is shown as text (Jinja escapes it for HTML, and
:func:`~outboxkit.core.printable.printable` escapes what a terminal would act on); the fields
named in ``OUTBOXKIT_CONSOLE_SENSITIVE_FIELDS`` are masked at any depth before anything is
rendered, so their values never reach the browser.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from outboxkit.core.printable import printable

__all__ = ["MASK", "masked", "show_payload"]

MASK = "•••"


def masked(value: Any, sensitive: Collection[str]) -> Any:
    """``value`` (decoded JSON) with the value of every key named in ``sensitive`` (compared
    case-insensitively), at any depth, replaced by :data:`MASK`."""
    if not sensitive:
        return value
    names = {name.lower() for name in sensitive}

    def walk(item: Any) -> Any:
        if isinstance(item, dict):
            return {
                key: MASK if str(key).lower() in names else walk(inner)
                for key, inner in item.items()
            }
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    return walk(value)


def show_payload(value: bytes | None, *, sensitive: Collection[str], limit: int) -> str:
    """A record's value as a page shows it: JSON indented with its sensitive fields masked,
    other bytes as text; cut after ``limit`` characters, saying how many were left out."""
    if value is None:
        return "(no value)"
    try:
        decoded = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        # Not JSON: no field can be told apart, so with sensitive fields set nothing is shown.
        if sensitive:
            return f"({len(value)} bytes, not JSON: hidden, sensitive fields are configured)"
        text = printable(value.decode("utf-8", "replace"))
    else:
        text = json.dumps(masked(decoded, sensitive), indent=2, ensure_ascii=False)
    if len(text) > limit:
        return f"{text[:limit]}\n… ({len(text) - limit} more characters)"
    return text
