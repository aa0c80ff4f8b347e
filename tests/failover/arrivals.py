"""When each event reached Kafka: a ``read_committed`` consumer of every partition, from the
beginning, that notes the wall-clock time it first saw each event id (and where it was).

Its own clock is the test process's, the same as the writers' commit times, so commit→arrival
is the delay a downstream consumer saw. It keeps reading across broker faults: aiokafka finds
new leaders by itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from uuid import UUID

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP


@dataclass(frozen=True)
class Arrival:
    #: When this reader got it (wall clock).
    at: float
    #: The record's timestamp: when the relay's producer made its batch (Kafka's CreateTime).
    sent: float
    partition: int
    offset: int


@dataclass
class ArrivalRecorder:
    bootstrap: str
    topic: str
    partitions: int
    #: Event id → its first arrival.
    arrivals: dict[UUID, Arrival] = field(default_factory=dict)
    #: Records per partition (re-deliveries too).
    per_partition: dict[int, int] = field(default_factory=dict)
    #: Partition → offsets of its committed records, in order (for G4).
    offsets: dict[int, list[int]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="failover-arrivals",
            # A dead leader's partitions are found again at the next metadata refresh.
            metadata_max_age_ms=1000,
        )
        await consumer.start()
        tps = [KafkaTP(self.topic, p) for p in range(self.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._read(consumer))

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                batches = await consumer.getmany(timeout_ms=200, max_records=2000)
                now = time.time()
                for tp, records in batches.items():
                    self.per_partition[tp.partition] = self.per_partition.get(
                        tp.partition, 0
                    ) + len(records)
                    self.offsets.setdefault(tp.partition, []).extend(r.offset for r in records)
                    for record in records:
                        event_id = UUID(dict(record.headers)["ce_id"].decode())
                        if event_id not in self.arrivals:
                            self.arrivals[event_id] = Arrival(
                                now, record.timestamp / 1000, tp.partition, record.offset
                            )
        finally:
            await consumer.stop()

    def busiest_partition(self) -> int:
        """The partition with the most records so far."""
        return max(range(self.partitions), key=lambda p: self.per_partition.get(p, 0))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
