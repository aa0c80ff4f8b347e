"""The relay engine's test harness: one :class:`Relay` wired to a spy outbox, a fake broker and
a manual ownership (the ``make`` fixture), shared by test_relay_engine.py,
test_relay_engine_ownership.py and test_relay_blocks.py."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, cast

import pytest
from prometheus_client import CollectorRegistry

from outboxkit.relay.engine import Relay
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.reconciler import CrashBackoff
from outboxkit.relay.records import OutboxRecord, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.schemas import Event, partition_for_key
from tests.helpers import wait_for
from tests.unit.relay_fakes import (
    FakeBroker,
    ManualOwnership,
    SpyStorage,
)

TOPIC = "t"


class Ping(Event, type="test.ping", topic=TOPIC):
    n: int = 0


def tp(partition: int) -> TopicPartition:
    return TopicPartition(TOPIC, partition)


@functools.cache
def keys_on(partition: int, partitions: int) -> list[str]:
    """Twenty keys that Kafka's partitioner puts on ``partition`` of ``partitions``."""
    keys: list[str] = []
    i = 0
    while len(keys) < 20:
        key = f"key-{i}"
        if partition_for_key(key.encode(), partitions) == partition:
            keys.append(key)
        i += 1
    return keys


async def until(
    condition: Callable[[], bool], what: str = "condition", *, within: float = 10.0
) -> None:
    await wait_for(condition, within=within, interval=0.005, what=what)


class Harness:
    """One relay wired to a spy outbox, a fake broker and a manual ownership of topic ``t``."""

    def __init__(self, *, partitions: int = 2, notify: bool = True, **overrides: Any) -> None:
        values: dict[str, Any] = {
            "database_url": "postgresql://x/y",
            "topics": TOPIC,
            "sweep_interval": 5.0,
            "retry_backoff_max": 0.05,
            "revoke_timeout": 2.0,
            "metrics_interval": 0.05,
            "max_attempts": 3,
            "batch_size": 10,
            # One transaction per partition, as before blocks: these tests isolate partitions
            # (test_relay_blocks.py covers blocks). No pacing between small batches.
            "partitions_per_transaction": 1,
            "batch_interval": 0.0,
        }
        self.settings = RelaySettings(**{**values, **overrides})
        self.partitions = partitions
        self.storage = SpyStorage(notify=notify)
        self.broker = FakeBroker()
        self.ownership = ManualOwnership({TOPIC: partitions})
        self.registry = CollectorRegistry()
        self.relay = Relay(
            self.settings,
            self.storage,
            self.storage,
            metrics=RelayMetrics(self.registry),
            publisher_factory=self.broker.factory,
            ownership_factory=self.ownership,
            fencer_factory=self.broker.fencer,
            crash_backoff=CrashBackoff(first=0.01),  # a crashed block restarts at once
        )
        self.broker.inspect = self.older_records_settled
        self.task: asyncio.Task[None] | None = None

    def older_records_settled(self, batch: Sequence[OutboxRecord]) -> list[str]:
        """The per-key barrier, checked as each batch goes out: every older record of a
        record's key has been settled (deleted or marked published) in the outbox before it."""
        unsettled = {
            (r.partition, r.key): r.id
            for r, state in sorted(self.storage.rows, key=lambda row: -cast(int, row[0].id))
            if state != "published"
        }
        return [
            f"record {r.id} sent before record {unsettled[(r.partition, r.key)]} of its key "
            "was settled"
            for r in batch
            if cast(int, unsettled.get((r.partition, r.key), r.id)) < cast(int, r.id)
        ]

    async def open(self) -> Harness:
        await self.storage.register_topics({TOPIC: self.partitions})
        return self

    def add(self, partition: int, key: int = 0, n: int = 0) -> OutboxRecord:
        """Commit an event with the ``key``-th key of ``partition``."""
        return self.storage.add(Ping(key=keys_on(partition, self.partitions)[key], n=n))

    async def start(self, assign: Iterable[int] | None = None) -> None:
        """Run the relay and assign ``assign`` (every partition by default)."""
        self.task = task = asyncio.create_task(self.relay.run(), name="relay under test")
        await until(lambda: self.relay.health().running or task.done(), "the relay to run")
        if task.done():
            self.task = None
            task.result()
        owned = range(self.partitions) if assign is None else assign
        await self.relay.assign(frozenset(tp(p) for p in owned))

    async def close(self) -> None:
        task, self.task = self.task, None
        if task is None:
            return
        self.broker.always.clear()
        self.broker.release()
        self.relay.stop()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise AssertionError("relay.run() did not return within 5 s of stop()")
        if not task.cancelled():
            task.result()

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


class MakeHarness(Protocol):
    def __call__(self, **kwargs: Any) -> Awaitable[Harness]: ...


@pytest.fixture
async def make() -> AsyncIterator[MakeHarness]:
    made: list[Harness] = []

    async def make(**kwargs: Any) -> Harness:
        harness = await Harness(**kwargs).open()
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.close()


def dedupe_repeats(ids: list[int]) -> list[int]:
    return [i for n, i in enumerate(ids) if n == 0 or ids[n - 1] != i]
