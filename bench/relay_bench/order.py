"""Per-key order (the product's guarantee G2, docs/guarantees.md) on what a phase published.

Every bench event carries ``seq``, its number among its key's events in the key's commit order
(how each phase makes it so is said where it writes). Read back from the topic in partition
offset order, a key's sequence numbers must never go down: a first appearance comes after every
earlier one of its key, and a re-delivery only repeats the key's latest event so far.
``R0 R1 R1 R2`` is fine, ``R0 R1 R2 R1`` is not, nor ``R0 R2 R1``. Missing events are another
figure (the phases count them): ``R0 R2`` is in order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

#: How many of a key's sequence numbers a violation shows, the out-of-order one last.
CONTEXT = 6


@dataclass(frozen=True, slots=True)
class Published:
    """One record read back: where it is on the topic, and its event's key and ``seq``."""

    partition: int
    offset: int
    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class Violation:
    """A record whose ``seq`` is below the highest of its key before it."""

    key: str
    partition: int
    offset: int
    #: The key's highest sequence number before this record.
    latest: int
    #: Whether this record's event appeared before (a stale re-delivery) or not (out of order).
    repeated: bool
    #: The key's sequence numbers up to this record, in offset order (the last CONTEXT).
    seqs: tuple[int, ...]

    def __str__(self) -> str:
        what = "re-delivered" if self.repeated else "first appears"
        return (
            f"key {self.key} (partition {self.partition}, offset {self.offset}): seq "
            f"{self.seqs[-1]} {what} after seq {self.latest}: …{', '.join(map(str, self.seqs))}"
        )


def order_violations(records: Iterable[Published]) -> list[Violation]:
    """Every record that breaks its key's order, in partition offset order. ``records`` may come
    in any order (they are sorted by partition and offset here)."""
    latest: dict[str, int] = {}
    seen: dict[str, set[int]] = defaultdict(set)
    history: dict[str, list[int]] = defaultdict(list)
    violations = []
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        key, seq = record.key, record.seq
        history[key].append(seq)
        top = latest.get(key)
        if top is not None and seq < top:
            violations.append(
                Violation(
                    key,
                    record.partition,
                    record.offset,
                    top,
                    seq in seen[key],
                    tuple(history[key][-CONTEXT:]),
                )
            )
        else:
            latest[key] = seq
        seen[key].add(seq)
    return violations


class KeySequences:
    """The next ``seq`` of each key, for writers that commit one event after another: a key's
    numbers follow its commit order only if one writer at a time writes it (the caller's
    promise)."""

    def __init__(self) -> None:
        self._next: dict[str, int] = defaultdict(int)

    def take(self, key: str) -> int:
        seq = self._next[key]
        self._next[key] = seq + 1
        return seq
