"""The relay engine against the in-memory outbox, fake publishers and a manual ownership.

Each test drives :class:`Relay` the way Kafka and a database would (assign/revoke, wake-ups,
publish failures) and checks the guarantees of the design notes that the engine alone carries:
no loss (G1), per-key order (G2), one publisher per partition with draining revocation (G4),
wake on commit with a fallback sweep (G5), bounded storage (G7), parked bad records (G8).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol
from uuid import uuid4

import pytest
from aiokafka.errors import KafkaConnectionError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from outboxkit.relay import engine
from outboxkit.relay.engine import Relay, RelayHealth, first_per_key
from outboxkit.relay.exceptions import OwnershipLostError, StorageUnavailableError
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import OutboxRecord, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.schemas import Event, partition_for_key
from tests.helpers import wait_for
from tests.unit.relay_fakes import (
    REJECTION,
    Failure,
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
        )
        self.task: asyncio.Task[None] | None = None

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


# -- G1: every record published, then removed ------------------------------------------------


async def test_every_record_is_published_once_in_id_order_and_deleted(make: MakeHarness) -> None:
    h = await make(batch_size=4)
    early = [h.add(p, key, n) for n in range(3) for p in (0, 1) for key in range(3)]
    await h.start()
    late = [h.add(p, key, n) for n in range(3, 6) for p in (0, 1) for key in range(3)]
    written = early + late

    await until(lambda: not h.storage.rows, "an empty outbox")

    assert sorted(h.broker.ids()) == [r.id for r in written]  # each exactly once
    for p in (0, 1):
        assert {r.partition for r in h.broker.topic[tp(p)]} == {p}
    for key, ids in h.broker.ids_by_key().items():
        assert ids == sorted(ids), f"key {key!r} out of order"
    assert all(len(call.ids) <= 3 for call in h.broker.calls)  # 3 keys per partition
    assert h.broker.violations == []
    assert h.metric("outboxkit_relay_published_total", topic=TOPIC) == len(written)
    assert h.metric("outboxkit_relay_in_flight") == 0


async def test_retention_keeps_published_rows_until_cleanup_purges_them(
    make: MakeHarness,
) -> None:
    retention = timedelta(milliseconds=300)
    h = await make(partitions=1, retention=retention, cleanup_interval=0.05, cleanup_batch=2)
    records = [h.add(0, key) for key in range(5)]  # one batch: one published_at
    await h.start()
    await until(lambda: len(h.broker.ids()) == 5, "five records published")

    kept = await h.storage.list_records("published", 10)
    assert [info.event_id for info in kept] == [r.event_id for r in records]
    assert all(info.published_at is not None for info in kept)
    assert await h.storage.list_records("pending", 10) == []

    await until(lambda: not h.storage.rows, "the cleanup to purge them", within=3)
    assert {(older, limit) for older, limit, _ in h.storage.purges} == {(retention, 2)}
    deleted = [n for _, _, n in h.storage.purges]
    # Small batches until a short one, all in one round once they are old enough.
    assert any(deleted[i : i + 3] == [2, 2, 1] for i in range(len(deleted)))
    assert h.broker.ids() == [r.id for r in records]  # purging never republishes


# -- G2: the per-key barrier -----------------------------------------------------------------


def record(rid: int, key: bytes) -> OutboxRecord:
    return OutboxRecord(
        id=rid, topic=TOPIC, partition=0, key=key, value=b"{}", headers=(), event_id=uuid4()
    )


def test_first_per_key_keeps_the_oldest_record_of_each_key() -> None:
    batch = [record(1, b"a"), record(2, b"b"), record(3, b"a"), record(4, b""), record(5, b"b")]
    assert [r.id for r in first_per_key(batch)] == [1, 2, 4]
    assert first_per_key([]) == []


@given(st.lists(st.sampled_from([b"a", b"b", b"c", b""]), max_size=30))
def test_first_per_key_is_the_first_occurrence_of_every_key(keys: list[bytes]) -> None:
    batch = first_per_key([record(i, key) for i, key in enumerate(keys)])
    assert [r.key for r in batch] == list(dict.fromkeys(keys))
    assert [r.id for r in batch] == [keys.index(r.key) for r in batch]


MAX_ATTEMPTS = 3
KEYS = ["a", "b", "c", "d", "e"]


@dataclass
class Scenario:
    keys: list[str]  #: key of each record, in write order
    rejections: list[int]  #: times the broker rejects each record (MAX_ATTEMPTS: parked)
    failures: list[Failure | None]  #: how the next publish calls fail
    written_first: int  #: records committed before the relay starts
    rebalance: bool  #: revoke and reassign everything after the rest is written


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=16))
    rejection = st.one_of(st.just(0), st.integers(1, MAX_ATTEMPTS))
    return Scenario(
        keys=keys,
        rejections=draw(st.lists(rejection, min_size=len(keys), max_size=len(keys))),
        failures=draw(st.lists(st.sampled_from([None, "error", "lost_ack"]), max_size=10)),
        written_first=draw(st.integers(0, len(keys))),
        rebalance=draw(st.booleans()),
    )


@pytest.mark.parametrize("per_transaction", [1, 32], ids=["partition", "block"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_per_key_order_holds_under_any_failures_and_rejections(
    per_transaction: int, scenario: Scenario
) -> None:
    """Both partitions in one transaction per batch (a block) or one each."""
    asyncio.run(_check_scenario(scenario, per_transaction))


async def _check_scenario(s: Scenario, per_transaction: int) -> None:
    h = await Harness(
        batch_size=3,
        max_in_flight=4,
        max_attempts=MAX_ATTEMPTS,
        retry_backoff_max=0.001,
        sweep_interval=0.05,
        partitions_per_transaction=per_transaction,
    ).open()
    h.broker.script.extend(s.failures)
    records: list[OutboxRecord] = []

    def write(indexes: range) -> None:
        for i in indexes:
            written = h.storage.add(Ping(key=s.keys[i], n=i))
            records.append(written)
            if s.rejections[i]:
                h.broker.reject[written.event_id] = s.rejections[i]

    skipped: list[OutboxRecord] = []
    write(range(s.written_first))
    try:
        await h.start()
        write(range(s.written_first, len(s.keys)))
        if s.rebalance:
            everything = frozenset(tp(p) for p in range(h.partitions))
            await h.relay.revoke(everything)
            await h.relay.assign(everything)

        async def drained() -> bool:
            failed = [r for r, state in h.storage.rows if state == "failed"]
            blocked = {r.key for r in failed}
            if failed and all(r.key in blocked for r, _ in h.storage.rows):
                # Only parked records and the records they block are left: skip the parked.
                await h.storage.skip_failed([r.event_id for r in failed])
                skipped.extend(failed)
                h.storage.signal_reconnect()
            return not h.storage.rows

        await wait_for(drained, within=10, interval=0.002, what="the outbox drained")
    finally:
        await h.close()

    parked = {r.id for r, n in zip(records, s.rejections, strict=True) if n == MAX_ATTEMPTS}
    assert h.broker.violations == []
    assert {r.id for r in skipped} == parked
    by_key = h.broker.ids_by_key()
    for key in set(s.keys):
        seen = by_key.get(key.encode(), [])
        expected = [r.id for r in records if r.key == key.encode() and r.id not in parked]
        assert seen == sorted(seen), f"key {key}: an older record after a newer one: {seen}"
        assert dedupe_repeats(seen) == expected
    for r, n in zip(records, s.rejections, strict=True):
        assert len(h.broker.rejections[r.event_id]) == n
    assert h.broker.max_in_flight <= 4


# -- G8: rejected records --------------------------------------------------------------------


async def test_rejected_record_is_retried_with_backoff_then_parked(make: MakeHarness) -> None:
    h = await make(partitions=1, max_attempts=4, retry_backoff_max=0.05)
    bad, good = h.add(0, 0), h.add(0, 1)
    h.broker.reject[bad.event_id] = None  # never accepted
    await h.start()

    await until(lambda: h.storage.state_of(bad) == "failed", "the bad record parked")
    rejected_at = h.broker.rejections[bad.event_id]
    assert len(rejected_at) == 4
    assert sum(bad.id in call.ids for call in h.broker.calls) == 4  # no tight loop
    gaps = [later - earlier for earlier, later in itertools.pairwise(rejected_at)]
    assert min(gaps) >= 0.04, f"no backoff between attempts: {gaps}"
    [info] = await h.storage.list_records("failed", 10)
    assert (info.event_id, info.attempts, info.last_error) == (bad.event_id, 4, REJECTION)
    assert h.broker.ids() == [good.id]
    assert h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="rejected") == 4
    assert h.metric("outboxkit_relay_parked_total", topic=TOPIC) == 1
    await until(
        lambda: h.metric("outboxkit_relay_failed_records", topic=TOPIC, partition="0") == 1,
        "the failed-records gauge",
    )


@pytest.mark.parametrize("operator", ["retry", "skip"])
async def test_failed_record_blocks_its_key_until_retried_or_skipped(
    make: MakeHarness, operator: str
) -> None:
    h = await make(partitions=1, max_attempts=2)
    bad, behind, other = h.add(0, 0), h.add(0, 0, n=1), h.add(0, 1)
    h.broker.reject[bad.event_id] = 2  # parked; accepted once retried
    await h.start()

    await until(lambda: h.storage.state_of(bad) == "failed", "the bad record parked")
    await until(lambda: h.storage.idle_looks(tp(0)) >= 1, "the partition to go idle")
    assert h.broker.ids() == [other.id]  # other keys flow
    assert h.storage.state_of(behind) == "pending"  # its key is blocked
    await until(
        lambda: h.metric("outboxkit_relay_backlog", topic=TOPIC, partition="0") == 1,
        "the backlog gauge",
    )

    if operator == "retry":
        assert await h.storage.retry_failed([bad.event_id]) == 1
        expected = [other.id, bad.id, behind.id]
    else:
        assert await h.storage.skip_failed([bad.event_id]) == 1
        expected = [other.id, behind.id]
    h.storage.signal_reconnect()
    await until(lambda: not h.storage.rows, "the key unblocked")
    assert h.broker.ids() == expected


# -- retriable errors ------------------------------------------------------------------------


async def test_retriable_errors_retry_the_batch_and_lose_nothing(make: MakeHarness) -> None:
    h = await make(partitions=1)
    first = [h.add(0, key) for key in range(3)]
    behind = h.add(0, 0, n=1)
    h.broker.script.extend(["error", "lost_ack", "error"])
    await h.start()

    await until(lambda: not h.storage.rows, "an empty outbox")
    batch = [r.id for r in first]
    # The lost acknowledgement repeats that batch (R0 R0 is allowed); the next record of key 0
    # waits until its predecessor is confirmed.
    assert h.broker.ids() == [*batch, *batch, behind.id]
    assert h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="retriable") == 3
    assert "KafkaConnectionError" in (h.relay.health().last_error or "")


async def test_storage_errors_are_retried(make: MakeHarness) -> None:
    h = await make(partitions=1)
    h.storage.fetch_errors.extend([StorageUnavailableError("db down")] * 2)
    r = h.add(0)
    await h.start()
    await until(lambda: not h.storage.rows, "an empty outbox")
    assert h.broker.ids() == [r.id]
    assert "StorageUnavailableError" in (h.relay.health().last_error or "")


@pytest.mark.parametrize("failure", ["error", "lost_ack", "hang"])
async def test_publisher_is_replaced_after_a_failed_publish(
    make: MakeHarness, failure: Failure
) -> None:
    h = await make(partitions=1, publish_timeout=0.1)
    r = h.add(0)
    h.broker.script.append(failure)  # "hang": no answer within publish_timeout
    await h.start()
    await until(lambda: not h.storage.rows, "an empty outbox")

    old, new = h.broker.publishers_of(tp(0))
    assert old.closed
    assert [call.publisher for call in h.broker.calls] == [old, new]
    assert h.broker.ids() == ([r.id] * 2 if failure == "lost_ack" else [r.id])
    assert h.broker.in_flight == 0  # the hung publish was cancelled
    assert h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="retriable") == 1
    expected = "TimeoutError" if failure == "hang" else "KafkaConnectionError"
    assert expected in (h.relay.health().last_error or "")


@pytest.mark.parametrize("error", [KafkaConnectionError("broker down"), OSError("unreachable")])
async def test_failed_start_is_retried_with_a_fresh_publisher(
    make: MakeHarness, error: Exception
) -> None:
    h = await make(partitions=1)
    r = h.add(0)
    h.broker.start_failures[tp(0)].append(error)
    await h.start()
    await until(lambda: not h.storage.rows, "an empty outbox")

    assert h.broker.violations == []  # never published through a producer that did not start
    failed, started = h.broker.publishers_of(tp(0))
    assert (failed.started, failed.closed, started.started) == (False, True, True)
    assert [call.publisher for call in h.broker.calls] == [started]
    assert h.broker.ids() == [r.id]


async def test_retry_policy_uses_no_deprecated_tenacity_api(make: MakeHarness) -> None:
    h = await make(partitions=1)
    r = h.add(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # as the suite's configuration says
        await h.start()
        await until(lambda: h.broker.ids() == [r.id], "the record")


# -- G4: fencing and revocation --------------------------------------------------------------


@pytest.mark.parametrize("fenced_at", ["start", "publish"])
async def test_fenced_partition_stops_publishing_and_deletes_nothing(
    make: MakeHarness, fenced_at: str
) -> None:
    h = await make()
    mine = [h.add(0, 0), h.add(0, 1)]
    sibling = h.add(1, 0)
    if fenced_at == "start":
        h.broker.start_failures[tp(0)].append(OwnershipLostError("t/0: ProducerFenced"))
    else:
        h.broker.always[tp(0)] = "fenced"

    def fenced() -> bool:
        return h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="fenced") == 1

    # Another relay owns t/0 now: the group no longer confirms it to this one.
    h.ownership.confirms = lambda parts: tp(0) not in parts or not fenced()
    await h.start()
    await until(lambda: fenced() and sibling.id in h.broker.ids(), "t/0 fenced and t/1 published")

    # New rows and a wake-up for every partition: t/1 goes on, t/0 stays quiet.
    late, late_sibling = h.add(0, 2), h.add(1, 1)
    h.storage.signal_reconnect()
    await until(lambda: late_sibling.id in h.broker.ids(), "t/1 to publish again")
    assert h.broker.ids(tp(0)) == []
    assert len(h.broker.calls_to(tp(0))) == (1 if fenced_at == "publish" else 0)
    assert [h.storage.state_of(r) for r in [*mine, late]] == ["pending"] * 3
    [publisher] = h.broker.publishers_of(tp(0))  # never restarted
    assert publisher.closed
    assert h.relay.health().fenced == ["t/0"]


async def test_revoke_waits_for_the_batch_in_flight(make: MakeHarness) -> None:
    h = await make()
    r = h.add(0)
    h.broker.block()
    await h.start()
    await until(lambda: h.broker.in_flight == 1, "a batch in flight")

    revoking = asyncio.create_task(h.relay.revoke(frozenset({tp(0)})))
    done, _ = await asyncio.wait({revoking}, timeout=0.05)
    assert not done, "revoke returned while a batch was in flight"
    h.broker.release()
    await asyncio.wait_for(revoking, 1)
    assert h.broker.ids(tp(0)) == [r.id]
    assert h.storage.state_of(r) is None  # confirmed and deleted before revoke returned
    assert all(p.closed for p in h.broker.publishers_of(tp(0)))
    assert h.relay.health().owned == ["t/1"]
    assert h.metric("outboxkit_relay_owned_partitions") == 1

    # Revoked: nothing more is published for t/0, even when every partition is woken.
    late, sibling = h.add(0, 1), h.add(1, 0)
    h.storage.signal_reconnect()
    await until(lambda: sibling.id in h.broker.ids(), "t/1 to publish")
    assert h.broker.ids(tp(0)) == [r.id]
    assert len(h.broker.publishers_of(tp(0))) == 1

    # Assigned again: a fresh publisher takes up where the last one stopped.
    await h.relay.assign(frozenset({tp(0)}))
    await until(lambda: late.id in h.broker.ids(), "t/0 to resume")
    assert h.broker.ids(tp(0)) == [r.id, late.id]
    assert len(h.broker.publishers_of(tp(0))) == 2


async def test_revoke_abandons_a_batch_stuck_past_revoke_timeout(make: MakeHarness) -> None:
    h = await make(revoke_timeout=0.2)
    r = h.add(0)
    h.broker.block()
    await h.start([0])
    await until(lambda: h.broker.in_flight == 1, "a batch in flight")

    began = time.monotonic()
    await h.relay.revoke(frozenset({tp(0)}))
    assert 0.15 <= time.monotonic() - began < 3.0  # revoke_timeout, not forever
    assert h.storage.state_of(r) == "pending"  # not confirmed: not deleted
    assert h.broker.in_flight == 0  # the stuck publish was cancelled
    [publisher] = h.broker.publishers_of(tp(0))
    assert publisher.closed
    assert h.relay.health().owned == []


async def test_revoke_during_retries_returns_without_another_attempt(make: MakeHarness) -> None:
    h = await make(revoke_timeout=5.0)
    h.add(0)
    h.broker.always[tp(0)] = "error"  # the broker is down
    await h.start([0])
    await until(lambda: len(h.broker.calls_to(tp(0))) >= 2, "the worker retrying")

    began = time.monotonic()
    await h.relay.revoke(frozenset({tp(0)}))
    took = time.monotonic() - began
    assert [c for c in h.broker.calls_to(tp(0)) if c.at >= began] == []
    assert took < 2.5, f"revoke took {took:.2f} s: it waited for revoke_timeout"


# -- G5: wake-ups ----------------------------------------------------------------------------


async def test_idle_worker_declares_waiting_and_wakes_on_a_commit(make: MakeHarness) -> None:
    h = await make(sweep_interval=30.0)
    await h.start()
    await until(lambda: h.storage.idle_looks(tp(0)) >= 1, "t/0 idle")
    assert (tp(0), True) in h.storage.waiting_calls

    began = time.monotonic()
    r = h.add(0)  # t/0 waits: the writer queues a wake-up
    await until(lambda: r.id in h.broker.ids(), "the new record")
    assert time.monotonic() - began < 5  # not the 30 s sweep
    assert h.metric("outboxkit_relay_wakeups_total", reason="notify") == 1
    # One record is not load: t/0 stays declared, the next commit wakes it too.
    await until(lambda: not h.storage.rows, "the record settled")
    assert [w for p, w in h.storage.waiting_calls if p == tp(0)] == [True]
    again = h.add(0, 1)
    await until(lambda: again.id in h.broker.ids(), "the next record")
    assert h.metric("outboxkit_relay_wakeups_total", reason="notify") == 2


async def test_reconnect_makes_every_partition_look_again(make: MakeHarness) -> None:
    h = await make(sweep_interval=30.0, notify=False)  # writers wake nobody
    await h.start()
    await until(
        lambda: h.storage.idle_looks(tp(0)) >= 1 and h.storage.idle_looks(tp(1)) >= 1,
        "both partitions idle",
    )
    records = [h.add(0), h.add(1)]

    h.storage.signal_reconnect()
    await until(lambda: len(h.broker.ids()) == 2, "both records")  # not the 30 s sweep
    assert sorted(h.broker.ids()) == [r.id for r in records]
    assert h.metric("outboxkit_relay_wakeups_total", reason="reconnect") == 1


async def test_sweep_finds_a_record_without_any_wake_up(make: MakeHarness) -> None:
    h = await make(partitions=1, sweep_interval=0.3, notify=False)
    await h.start()
    await until(lambda: h.storage.idle_looks(tp(0)) >= 1, "t/0 idle")

    began = time.monotonic()
    r = h.add(0)
    await until(lambda: r.id in h.broker.ids(), "the sweep")
    assert time.monotonic() - began < 0.3 + 1.5  # a sweep's period, with room for a busy CI
    assert h.metric("outboxkit_relay_wakeups_total", reason="sweep") >= 1
    assert h.metric("outboxkit_relay_wakeups_total", reason="notify") == 0


# -- flow control and lifecycle --------------------------------------------------------------


async def test_max_in_flight_bounds_records_handed_to_publishers(make: MakeHarness) -> None:
    h = await make(partitions=3, max_in_flight=3, batch_size=10)
    written = [h.add(p, key) for p in range(3) for key in range(4)]
    h.broker.block()
    await h.start()

    await until(lambda: h.broker.in_flight == 3, "a first batch in flight")
    # Every partition has read its batch; a read and the wait for budget that follows it run in
    # one step of the worker's task (the in-memory read never suspends), so the other two are
    # now waiting for budget.
    await until(
        lambda: {f.tp for f in h.storage.fetches if f.found} == {tp(0), tp(1), tp(2)},
        "every partition trying to send",
    )
    assert h.broker.in_flight == 3
    assert len(h.broker.calls) == 1
    assert h.metric("outboxkit_relay_in_flight") == 3

    h.broker.release()
    await until(lambda: not h.storage.rows, "an empty outbox")
    assert sorted(h.broker.ids()) == [r.id for r in written]
    assert h.broker.max_in_flight == 3
    assert h.metric("outboxkit_relay_in_flight") == 0


async def test_stop_drains_the_batch_in_flight_then_run_returns(make: MakeHarness) -> None:
    h = await make()
    r = h.add(0)
    h.broker.block()
    await h.start()
    await until(lambda: h.broker.in_flight == 1, "a batch in flight")
    task, h.task = h.task, None
    assert task is not None

    h.relay.stop()
    done, _ = await asyncio.wait({task}, timeout=0.05)
    assert not done, "run() returned while a batch was in flight"
    h.broker.release()
    await asyncio.wait_for(task, 1)
    assert h.broker.ids() == [r.id]
    assert h.storage.state_of(r) is None
    assert h.ownership.stopped
    assert all(p.closed for p in h.broker.publishers)
    health = h.relay.health()
    assert (health.running, health.owned) == (False, [])


@pytest.mark.parametrize(
    ("error", "message"),
    [(RuntimeError("consumer crashed"), "consumer crashed"), (None, "ownership ended")],
)
async def test_run_raises_when_a_side_task_ends(
    make: MakeHarness, error: BaseException | None, message: str
) -> None:
    h = await make()
    await h.start()
    task, h.task = h.task, None
    assert task is not None

    h.ownership.end(error)
    with pytest.raises(RuntimeError, match=message):
        await asyncio.wait_for(task, 1)
    assert h.ownership.stopped
    health = h.relay.health()
    assert (health.running, health.owned, health.healthy) == (False, [], False)


async def test_run_raises_when_a_partition_worker_dies(make: MakeHarness) -> None:
    h = await make(partitions=1)
    h.broker.always[tp(0)] = "crash"
    h.add(0)
    await h.start()
    task, h.task = h.task, None
    assert task is not None
    with pytest.raises(RuntimeError, match="a bug in the publisher"):
        await asyncio.wait_for(task, 0.5)


async def test_failed_start_leaves_no_workers_behind(make: MakeHarness) -> None:
    h = await make(partitions=1)
    h.ownership.initial = frozenset({tp(0)})  # Kafka assigns during start()
    # The assignment's registration goes through, then the database refuses for good.
    h.storage.register_errors.extend([None, RuntimeError("permission denied for table topics")])
    try:
        with pytest.raises(RuntimeError, match="permission denied"):
            await asyncio.wait_for(h.relay.run(), 1)
        assert h.ownership.callback_errors == []
        assert h.ownership.stopped
        assert h.relay.health().owned == []
    finally:
        await h.relay.revoke(frozenset({tp(0)}))


async def test_assignment_starts_workers_even_if_registering_counts_fails(
    make: MakeHarness,
) -> None:
    h = await make(partitions=1)
    h.ownership.initial = frozenset({tp(0)})  # Kafka assigns during start()
    h.storage.register_errors.append(RuntimeError("deadlock detected"))  # that one call only
    r = h.add(0)
    await h.start(assign=[])
    await until(lambda: h.broker.ids() == [r.id], "the record", within=3.0)  # < the sweep


async def test_stop_while_the_database_is_away_at_start(make: MakeHarness) -> None:
    h = await make(partitions=1)
    h.storage.register_error = StorageUnavailableError("db down")
    task = asyncio.create_task(h.relay.run())
    try:
        await until(lambda: h.storage.register_calls >= 2, "register_topics retried")
        h.relay.stop()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, "run() did not return after stop()"
        assert h.ownership.stopped
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_group_leave_that_never_ends_does_not_keep_the_relay_from_stopping(
    make: MakeHarness,
) -> None:
    h = await make(partitions=1, revoke_timeout=0.2, session_timeout=1.0, heartbeat_interval=0.3)
    h.ownership.hang_on_stop = True  # the coordinator never answers the LeaveGroup
    await h.start()
    began = time.monotonic()
    await h.close()  # fails if run() has not returned within 5 s
    assert h.ownership.stopped
    assert time.monotonic() - began < 0.2 + 1.0 + 2.0  # revoke_timeout + session_timeout


async def test_a_task_that_ignores_its_cancellation_is_left_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine, "_CANCEL_GRACE", 0.1)
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # like a library call that swallows the cancellation

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait_for(engine._settle([task]), 2)
    assert not task.done()
    release.set()
    await task


async def test_health_reports_ownership_progress_and_stalled_partitions(
    make: MakeHarness,
) -> None:
    h = await make(stall_after=0.2, metrics_interval=0.02)
    before = h.relay.health()
    assert before == RelayHealth(
        running=False, owned=[], stalled=[], seconds_since_progress=None, last_error=None
    )
    assert not before.healthy
    h.broker.script.append("error")
    await h.start()
    h.add(0)
    await until(lambda: h.relay.health().seconds_since_progress is not None, "progress")
    # On a busy machine the retry after the error can outlast stall_after: t/0 is then
    # reported stalled until the next backlog measurement sees it moved.
    await until(lambda: h.relay.health().healthy, "healthy once t/0 moved")
    health = h.relay.health()
    assert health.owned == ["t/0", "t/1"]
    assert health.stalled == []
    assert "KafkaConnectionError" in (health.last_error or "")
    assert h.metric("outboxkit_relay_owned_partitions") == 2

    # A record of t/1 waits longer than stall_after: t/1 is stalled, the relay unhealthy.
    h.broker.block()
    h.add(1)
    await until(lambda: h.relay.health().stalled == ["t/1"], "t/1 reported stalled")
    assert not h.relay.health().healthy
    h.broker.release()
    await until(lambda: h.relay.health().healthy, "healthy again once t/1 moves")

    await h.relay.revoke(frozenset({tp(1)}))
    assert h.relay.health().owned == ["t/0"]
    await h.close()
    health = h.relay.health()
    assert (health.running, health.owned, health.healthy) == (False, [], False)
