"""Counts in the words a person reads: ``1 partition``, ``3 partitions``."""

from __future__ import annotations


def counted(number: int, singular: str, plural: str | None = None) -> str:
    """``number`` and its noun, singular for 1 (``plural`` for an irregular noun; the singular
    and an ``s`` by default)."""
    return f"{number} {singular if number == 1 else plural or singular + 's'}"
