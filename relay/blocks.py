"""Which Kafka transaction carries which partitions, and whom a new owner must fence.

A relay publishes the partitions it owns in *blocks*: aligned power-of-two ranges of one topic's
partitions (``[0, 8)``, ``[8, 12)``, …), one transactional producer and one Kafka transaction
per block and batch. One relay that owns all six partitions of a topic runs one transaction per
batch instead of six: the broker's work per transaction (AddPartitionsToTxn, EndTxn, markers)
and the client's CPU per transaction are what bound latency and CPU at low and moderate rates.

Fencing (guarantee G4) stays Kafka's: a block's ``transactional.id`` is derived from the block,
and a relay that gains partition ``p`` initialises, before it reads ``p``'s outbox, the id of
**every** block that contains ``p`` at every level (``MAX_LEVEL + 1`` ids). Whichever block an
earlier owner published ``p`` through — any zombie, whatever it owned — is among them, so its
open transaction is aborted and its later sends are refused. A relay uses a block only while it
owns every partition in it, so it never fences a block another live relay legitimately uses.

The levels are fixed (not derived from a topic's partition count or from a setting), so relays
that disagree on either still fence each other. Level 0 ids are the per-partition ids of earlier
versions (``<group>.<topic>.<partition>``): a new owner fences an old relay's producer too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from outboxkit.relay.records import TopicPartition

#: Blocks span at most 2**MAX_LEVEL partitions. Fixed: see the module docstring.
MAX_LEVEL = 5


@dataclass(frozen=True, order=True)
class Block:
    """Partitions ``[start, start + 2**level)`` of ``topic`` (those that exist)."""

    topic: str
    start: int
    level: int

    @property
    def size(self) -> int:
        return 1 << self.level

    def partitions(self, partition_count: int) -> list[TopicPartition]:
        end = min(self.start + self.size, partition_count)
        return [TopicPartition(self.topic, p) for p in range(self.start, end)]

    def transactional_id(self, group_id: str) -> str:
        if self.level == 0:  # the per-partition id of earlier versions
            return f"{group_id}.{self.topic}.{self.start}"
        return f"{group_id}.{self.topic}.{self.start}-{self.start + self.size - 1}"

    def __str__(self) -> str:
        if self.level == 0:
            return f"{self.topic}/{self.start}"
        return f"{self.topic}/{self.start}-{self.start + self.size - 1}"


def containing(tp: TopicPartition) -> list[Block]:
    """Every block that contains ``tp``, one per level."""
    return [
        Block(tp.topic, (tp.partition >> level) << level, level) for level in range(MAX_LEVEL + 1)
    ]


def fence_ids(group_id: str, partitions: Iterable[TopicPartition]) -> set[str]:
    """The transactional ids a new owner of ``partitions`` initialises before reading them."""
    return {b.transactional_id(group_id) for tp in partitions for b in containing(tp)}


def plan(
    owned: Iterable[TopicPartition], partition_counts: Mapping[str, int], max_level: int
) -> list[Block]:
    """The fewest blocks (of at most ``2**max_level`` partitions) that cover exactly ``owned``.

    Deterministic: two relays owning the same partitions choose the same blocks. A block whose
    upper half holds no existing partition is named by its lower half (with 6 partitions, all of
    them form ``[0, 8)``, not ``[0, 16)``)."""
    max_level = min(max_level, MAX_LEVEL)
    by_topic: dict[str, set[int]] = defaultdict(set)
    for tp in owned:
        by_topic[tp.topic].add(tp.partition)
    blocks: list[Block] = []
    for topic, mine in sorted(by_topic.items()):
        count = partition_counts.get(topic, max(mine) + 1)
        blocks += _topic_blocks(topic, mine, count, max_level)
    return blocks


def _topic_blocks(topic: str, mine: set[int], count: int, max_level: int) -> list[Block]:
    blocks: list[Block] = []

    def visit(start: int, level: int) -> None:
        existing = range(start, min(start + (1 << level), count))
        owned_here = sum(1 for p in existing if p in mine)
        if owned_here == 0:
            return
        if owned_here == len(existing) and level <= max_level:
            while level > 0 and start + (1 << (level - 1)) >= count:
                level -= 1  # the upper half is empty: the lower half is the same block
            blocks.append(Block(topic, start, level))
            return
        visit(start, level - 1)
        visit(start + (1 << (level - 1)), level - 1)

    for root in range(0, count, 1 << MAX_LEVEL):
        visit(root, MAX_LEVEL)
    return blocks
