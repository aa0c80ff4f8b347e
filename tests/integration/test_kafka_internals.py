"""The canary of :class:`outboxkit.core.kafka_internals.GroupMembership`, the one reach that
needs a broker: what aiokafka's consumer knows of its membership, read from a consumer that
joins a group on the shared broker (the other reaches: tests/unit/test_kafka_internals.py)."""

from __future__ import annotations

import time
import uuid

from outboxkit.core import kafka_clients, kafka_internals
from outboxkit.core.settings import KafkaConnectionSettings
from tests.helpers import wait_for
from tests.integration.conftest import MakeTopic


async def test_group_membership_reads_a_member_that_joined_and_hears_its_heartbeats(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """Would catch an aiokafka that moved its consumer's coordinator, the member id, the
    generation, the rejoin request or the heartbeat: the relay would then never notice that its
    membership lapsed behind a half-open link, or confirm one while it rejoins."""
    topic = await make_topic("membership", partitions=1)
    settings = KafkaConnectionSettings(kafka_bootstrap_servers=kafka_bootstrap.split(","))
    consumer = kafka_clients.consumer(
        settings,
        topic,
        group_id=f"canary-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=100,
    )
    group = kafka_internals.GroupMembership(consumer)
    heard: list[float] = []
    try:
        await consumer.start()  # returns once the group assigned the partition
        assert group.member_id is not None
        assert group.member_id.startswith("aiokafka-")  # the client id, then the broker's uuid
        assert group.coordinator_known
        assert not group.rejoining
        assert group.on_heartbeat_answered(lambda: heard.append(time.monotonic()))

        await wait_for(
            lambda: len(heard) >= 2, within=10, what="two heartbeats the coordinator answered"
        )

        consumer.unsubscribe()  # leaves the group: no member id until it joins again
        await wait_for(lambda: group.rejoining, within=10, what="the member out of its group")
    finally:
        await consumer.stop()
