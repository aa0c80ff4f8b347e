"""How the relay's consumer group spreads partitions: contiguous ranges, in a stable order.

A relay publishes its partitions in aligned blocks, one Kafka transaction per block
(:mod:`outboxkit.relay.blocks`), so it wants contiguous partitions: each member gets one range
of each topic, the sizes as even as they can be (like Kafka's range assignor). Members are
ordered by member id; a static member's id starts with its ``group.instance.id``, so relays with
stable instance ids keep their ranges across restarts.

A member may ask not to be given some partitions: a relay that could not publish them (a block
with records pending and no progress, :mod:`outboxkit.relay.stuck`) names them in its
subscription's user data (``{"avoid": {topic: [partitions]}}``), and the ranges, still the same
sizes, go to the members in an order that gives no member a range it asked to avoid, when one
exists; otherwise as usual (a partition every relay avoids still has an owner). Members whose
user data is empty or unreadable (an older relay of the same protocol) avoid nothing.

The protocol name is the relay's own and nothing else is offered. Relays of earlier versions
(round robin, one transaction per partition, draining on every rebalance) cannot share a group
with these, and Kafka refuses the join of whichever kind comes second: a mixed group could let an
older relay publish a partition that a newer one still publishes lazily through a block the older
one never fences. During a rolling upgrade the new relays wait, logging why, until the old ones
have stopped.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

PROTOCOL = "outboxkit-blocks-v1"


def split(partitions: int, members: list[str]) -> dict[str, range]:
    """Contiguous ranges of ``partitions`` for ``members`` (in this order), sizes within one."""
    if not members:
        return {}
    base, extra = divmod(partitions, len(members))
    ranges: dict[str, range] = {}
    start = 0
    for i, member in enumerate(members):
        size = base + (1 if i < extra else 0)
        ranges[member] = range(start, start + size)
        start += size
    return ranges


def avoiding(
    partitions: int, members: list[str], avoid: Mapping[str, frozenset[int]]
) -> dict[str, range]:
    """:func:`split`'s ranges, each given to the first member (in ``members``' order) left that
    avoids none of its partitions, or else to the first left."""
    sizes = [len(r) for r in split(partitions, members).values()]
    left = list(members)
    ranges: dict[str, range] = {}
    start = 0
    for size in sizes:
        part_range = range(start, start + size)
        member = next((m for m in left if not avoid.get(m, frozenset()) & set(part_range)), left[0])
        left.remove(member)
        ranges[member] = part_range
        start += size
    return ranges


class BlockAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """One per relay: :attr:`avoid` is what its member asks not to be given."""

    name = PROTOCOL
    version = 0

    def __init__(self) -> None:
        #: Topic → partitions this relay asks not to be given, at its next join.
        self.avoid: dict[str, frozenset[int]] = {}

    @classmethod
    def assign(
        cls,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        by_topic: dict[str, list[str]] = defaultdict(list)
        for member, metadata in members.items():
            for topic in metadata.subscription:
                by_topic[topic].append(member)
        avoid = {member: _avoided(metadata.user_data) for member, metadata in members.items()}
        assignment: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for topic, subscribers in by_topic.items():
            partitions = cluster.partitions_for_topic(topic)
            if not partitions:
                continue
            avoided = {m: avoid[m].get(topic, frozenset()) for m in subscribers}
            ranges = avoiding(len(partitions), sorted(subscribers), avoided)
            for member, part_range in ranges.items():
                if part_range:
                    assignment[member][topic] = list(part_range)
        return {
            member: ConsumerProtocolMemberAssignment(
                cls.version, sorted(assignment[member].items()), b""
            )
            for member in members
        }

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        # Constant for a member unless it avoids partitions: a static member that restarts
        # rejoins without a rebalance.
        wanted = sorted(topics)
        avoid = {t: sorted(self.avoid[t]) for t in wanted if self.avoid.get(t)}
        data = json.dumps({"avoid": avoid}, separators=(",", ":")).encode() if avoid else b""
        return ConsumerProtocolMemberMetadata(self.version, wanted, data)

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass


def _avoided(user_data: bytes | None) -> dict[str, frozenset[int]]:
    """The partitions a member's user data asks to avoid; none if it is empty or unreadable."""
    if not user_data:
        return {}
    try:
        avoid = json.loads(user_data)["avoid"]
        return {str(t): frozenset(int(p) for p in ps) for t, ps in avoid.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
