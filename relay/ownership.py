"""Partition ownership: the relay's Kafka consumer-group membership is its right to publish.

The relay's consumer subscribes to the topics it publishes to and pauses every partition it is
assigned, so it never fetches data; it only keeps polling to stay in the group. Kafka's
rebalance protocol then spreads the partitions over the relay instances and moves them when an
instance joins, leaves or dies.

aiokafka awaits the rebalance callbacks but logs and swallows what they raise, so they never
raise: a failure to drain is logged, and correctness rests on fencing (the new owner's
transactional producer), not on the callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP

from outboxkit.core.kafka import missing_topics
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.settings import RelaySettings

logger = structlog.get_logger("outboxkit.relay")

PartitionsCallback = Callable[[frozenset[TopicPartition]], Awaitable[None]]


class KafkaOwnership:
    """Joins group ``outboxkit.relay.<name>``; calls back on assignment and revocation."""

    def __init__(
        self,
        settings: RelaySettings,
        *,
        on_assigned: PartitionsCallback,
        on_revoked: PartitionsCallback,
    ) -> None:
        self._settings = settings
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            group_id=settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=int(settings.session_timeout * 1000),
            heartbeat_interval_ms=int(settings.heartbeat_interval * 1000),
            # The revocation callback drains in-flight records: give it time before the group
            # gives up on this member.
            rebalance_timeout_ms=int((settings.revoke_timeout + settings.session_timeout) * 1000),
            client_id=f"{settings.group_id}-ownership",
        )
        self.owned: frozenset[TopicPartition] = frozenset()
        self.rebalances = 0

    async def start(self) -> dict[str, int]:
        """Join the group; return each topic's partition count from Kafka's metadata."""
        self._consumer.subscribe(self._settings.topics, listener=_Listener(self))
        # start() fetches the metadata of the subscribed topics before it returns.
        await self._consumer.start()
        partitions: dict[str, int] = {}
        missing = []
        for topic in self._settings.topics:
            found = self._consumer.partitions_for_topic(topic)
            if not found:
                missing.append(topic)
            else:
                partitions[topic] = len(found)
        if missing:
            await self._consumer.stop()
            raise missing_topics(missing)
        return partitions

    def partition_counts(self) -> dict[str, int]:
        counts = {}
        for topic in self._settings.topics:
            found = self._consumer.partitions_for_topic(topic)
            if found:
                counts[topic] = len(found)
        return counts

    async def run(self) -> None:
        """Stay in the group: poll (nothing comes back, every partition is paused)."""
        while True:
            await self._consumer.getmany(timeout_ms=500)
            # Kafka forgets pauses on rebalance; re-pause whatever is assigned now.
            assigned = self._consumer.assignment()
            if assigned - self._consumer.paused():
                self._consumer.pause(*assigned)

    async def stop(self) -> None:
        """Leave the group (revocation drains first)."""
        await self._consumer.stop()

    async def _assigned(self, assigned: set[KafkaTP]) -> None:
        self._consumer.pause(*assigned)
        self.owned = frozenset(TopicPartition(tp.topic, tp.partition) for tp in assigned)
        self.rebalances += 1
        logger.info("partitions assigned", partitions=sorted(map(str, self.owned)))
        await self._on_assigned(self.owned)

    async def _revoked(self, revoked: set[KafkaTP]) -> None:
        gone = frozenset(TopicPartition(tp.topic, tp.partition) for tp in revoked)
        self.owned = self.owned - gone
        if gone:
            logger.info("partitions revoked", partitions=sorted(map(str, gone)))
            await self._on_revoked(gone)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ownership: KafkaOwnership) -> None:
        self._ownership = ownership

    async def on_partitions_revoked(self, revoked: set[KafkaTP]) -> None:
        try:
            await self._ownership._revoked(revoked)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("draining revoked partitions failed")

    async def on_partitions_assigned(self, assigned: set[KafkaTP]) -> None:
        try:
            await self._ownership._assigned(assigned)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("starting assigned partitions failed")
