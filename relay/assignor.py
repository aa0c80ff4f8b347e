"""How the relay's consumer group spreads partitions: contiguous ranges, in a stable order.

A relay publishes its partitions in aligned blocks, one Kafka transaction per block
(:mod:`outboxkit.relay.blocks`), so it wants contiguous partitions: each member gets one range
of each topic, the sizes as even as they can be (like Kafka's range assignor). Members are
ordered by member id; a static member's id starts with its ``group.instance.id``, so relays with
stable instance ids keep their ranges across restarts.

The protocol name is the relay's own and nothing else is offered. Relays of earlier versions
(round robin, one transaction per partition, draining on every rebalance) cannot share a group
with these, and Kafka refuses the join of whichever kind comes second: a mixed group could let an
older relay publish a partition that a newer one still publishes lazily through a block the older
one never fences. During a rolling upgrade the new relays wait, logging why, until the old ones
have stopped.
"""

from __future__ import annotations

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


class BlockAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    name = PROTOCOL
    version = 0

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
        assignment: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for topic, subscribers in by_topic.items():
            partitions = cluster.partitions_for_topic(topic)
            if not partitions:
                continue
            for member, part_range in split(len(partitions), sorted(subscribers)).items():
                if part_range:
                    assignment[member][topic] = list(part_range)
        return {
            member: ConsumerProtocolMemberAssignment(
                cls.version, sorted(assignment[member].items()), b""
            )
            for member in members
        }

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        # Constant for a member: a static member that restarts rejoins without a rebalance.
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass
