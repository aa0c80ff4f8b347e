"""Batches of a block: one record per key each (the per-key barrier), and the bound on records
in flight over all blocks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import OutboxRecord


def by_depth(records: Sequence[OutboxRecord]) -> list[list[OutboxRecord]]:
    """``records`` (each key's in commit order) as batches of at most one record per key: the
    oldest record of each key first, then each key's second, and so on, each in the order
    given. One batch is in flight at a time (the per-key barrier)."""
    seen: dict[tuple[str, int, bytes], int] = {}
    ranks: list[list[OutboxRecord]] = []
    for record in records:
        key = (record.topic, record.partition, record.key)
        depth = seen.get(key, 0)
        seen[key] = depth + 1
        if depth == len(ranks):
            ranks.append([])
        ranks[depth].append(record)
    return ranks


def first_per_key(records: Sequence[OutboxRecord]) -> list[OutboxRecord]:
    """The oldest record of each key, in the order given."""
    ranks = by_depth(records)
    return ranks[0] if ranks else []


class InFlightLimit:
    """Bounds the records sent and not yet confirmed, over all blocks."""

    def __init__(self, limit: int, metrics: RelayMetrics) -> None:
        self._free = limit
        self._limit = limit
        self._changed = asyncio.Condition()
        self._metrics = metrics

    async def take(self, want: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self._free > 0)
            granted = min(want, self._free)
            self._free -= granted
            self._metrics.in_flight.set(self._limit - self._free)
            return granted

    async def give(self, count: int) -> None:
        async with self._changed:
            self._free += count
            self._metrics.in_flight.set(self._limit - self._free)
            self._changed.notify_all()
