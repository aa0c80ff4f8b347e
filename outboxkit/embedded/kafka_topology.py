"""Which broker does what, right now: the leader of a partition, the coordinator of a
transactional id, the coordinator of a consumer group.

Failover tests kill exactly the broker a fault is about (the leader of the busiest partition,
the relays' transaction coordinator, a group's coordinator), so they ask the cluster, as a
client would, instead of guessing from a node id: a Metadata request for leaders and
FindCoordinator (key type 1: transaction, 0: group) for coordinators. The answers are node ids
(``KafkaNode.node_id``; :meth:`~outboxkit.embedded.kafka.KafkaCluster.node` finds the node).

While a broker is down or an election runs, the cluster may answer "no leader" or "coordinator
not available": every lookup retries until ``timeout`` and then raises TimeoutError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self, TypeVar

from aiokafka.client import CoordinationType
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import TopicPartition

from outboxkit.core import kafka_clients
from outboxkit.core.settings import KafkaConnectionSettings

__all__ = ["KafkaTopology"]

T = TypeVar("T")

#: Between two attempts of a lookup the cluster could not answer yet.
_RETRY = 0.2


class KafkaTopology:
    """Lookups over one low-level client: ``async with KafkaTopology(bootstrap) as topology``.

    ``bootstrap`` is ``host:port,…`` (a PLAINTEXT cluster, as the embedded one) or whole
    connection settings (TLS, SASL)."""

    def __init__(self, bootstrap: str | KafkaConnectionSettings, *, timeout: float = 30.0) -> None:
        settings = (
            KafkaConnectionSettings(kafka_bootstrap_servers=bootstrap.split(","))
            if isinstance(bootstrap, str)
            else bootstrap
        )
        self._client = kafka_clients.client(
            settings, client_id="outboxkit-topology", request_timeout_ms=5000
        )
        self.timeout = timeout

    async def __aenter__(self) -> Self:
        await self._client.bootstrap()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._client.close()

    async def partition_leader(
        self, topic: str, partition: int, *, other_than: int | None = None
    ) -> int:
        """Node id of the broker that leads ``topic``'s ``partition``; with ``other_than``, of
        the one that leads it once that broker no longer does (after it was killed or shut
        down: the election's outcome)."""

        async def ask() -> int | None:
            self._client.add_topic(topic)
            await self._client.force_metadata_update()
            leader: int | None = self._client.cluster.leader_for_partition(
                TopicPartition(topic, partition)
            )
            # None: unknown partition; -1: no leader (an election is running).
            if leader is None or leader < 0 or leader == other_than:
                return None
            return leader

        return await self._retry(ask, f"the leader of {topic}/{partition}")

    async def leaders(self, topic: str) -> dict[int, int]:
        """Partition → node id of its leader, for every partition of ``topic``."""
        await self.partition_leader(topic, 0)  # waits for the topic's metadata
        partitions = self._client.cluster.partitions_for_topic(topic) or set()
        return {p: await self.partition_leader(topic, p) for p in sorted(partitions)}

    async def under_replicated(self) -> list[str]:
        """Partitions of every topic (the transaction and offsets topics too) whose in-sync
        replicas are fewer than their replicas, as ``topic/partition``: a restarted broker is
        back in service once this is empty, and a rolling restart waits for it before taking
        the next broker down (as operators do), or ``min.insync.replicas`` refuses writes."""

        async def ask() -> list[str]:
            node = self._client.get_random_node()
            response = await self._client.send(node, MetadataRequest(None))
            lagging = []
            for _error, topic, _internal, partitions in response.topics:
                for _p_error, partition, _leader, replicas, isr, *_ in partitions:
                    if len(isr) < len(replicas):
                        lagging.append(f"{topic}/{partition}")
            return sorted(lagging)

        return await self._retry(ask, "the cluster's metadata")

    async def transaction_coordinator(self, transactional_id: str) -> int:
        """Node id of the broker that coordinates ``transactional_id`` (FindCoordinator, key
        type 1): it fences the id's producers and writes its transactions' markers."""
        return await self._coordinator(CoordinationType.TRANSACTION, transactional_id)

    async def group_coordinator(self, group_id: str) -> int:
        """Node id of the broker that coordinates consumer group ``group_id`` (FindCoordinator,
        key type 0): it runs the group's joins and rebalances and keeps its offsets."""
        return await self._coordinator(CoordinationType.GROUP, group_id)

    async def _coordinator(self, kind: CoordinationType, key: str) -> int:
        async def ask() -> int | None:
            await self._client.force_metadata_update()  # forget brokers that died
            node_id: int = await self._client.coordinator_lookup(kind, key)
            return node_id

        what = "transaction" if kind == CoordinationType.TRANSACTION else "group"
        return await self._retry(ask, f"the {what} coordinator of {key}")

    async def _retry(self, ask: Callable[[], Awaitable[T | None]], what: str) -> T:
        deadline = time.monotonic() + self.timeout
        last: str = "no answer"
        while True:
            try:
                answer = await ask()
            except KafkaError as exc:  # not available yet, loading, moved: ask again
                last = repr(exc)
            else:
                if answer is not None:
                    return answer
                last = "no leader"
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not find {what} within {self.timeout} s ({last})")
            await asyncio.sleep(_RETRY)
