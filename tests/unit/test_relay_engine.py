"""The relay engine against the in-memory outbox, fake publishers and a manual ownership
(tests/unit/relay_engine_harness.py): what it publishes and in which order.

Each test drives :class:`Relay` the way Kafka and a database would (assign/revoke, wake-ups,
publish failures) and checks the guarantees of the design notes that the engine alone carries:
no loss (G1), bounded storage (G7), per-key order (G2), parked bad records (G8), retriable
errors. Ownership, wake-ups, flow control and the lifecycle (G4, G5) are in
test_relay_engine_ownership.py.
"""

from __future__ import annotations

import asyncio
import itertools
import warnings
from dataclasses import dataclass
from datetime import timedelta
from uuid import uuid4

import pytest
import structlog
from aiokafka.errors import KafkaConnectionError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxkit.relay.batches import first_per_key
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.memory import InMemoryOutboxOperations
from outboxkit.relay.records import OutboxRecord
from tests.helpers import wait_for
from tests.unit.relay_engine_harness import (
    TOPIC,
    Harness,
    MakeHarness,
    Ping,
    dedupe_repeats,
    make,
    tp,
    until,
)
from tests.unit.relay_fakes import (
    REJECTION,
    Failure,
)

__all__ = ["make"]  # the fixture, from relay_engine_harness


def operations(h: Harness) -> InMemoryOutboxOperations:
    """The operator's repairs (``outboxkit outbox …``) on the harness's outbox."""
    return InMemoryOutboxOperations(h.storage)


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

    kept = await operations(h).list_records("published", 10)
    assert [info.event_id for info in kept] == [r.event_id for r in records]
    assert all(info.published_at is not None for info in kept)
    assert await operations(h).list_records("pending", 10) == []

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
    storage_failures: set[int]  #: storage calls that fail (odd: after settling)


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
        storage_failures=draw(st.sets(st.integers(1, 30), max_size=4)),
    )


@pytest.mark.parametrize("claim_depth", [1, 4], ids=["depth1", "depth4"])
@pytest.mark.parametrize("per_transaction", [1, 32], ids=["partition", "block"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_per_key_order_holds_under_any_failures_and_rejections(
    per_transaction: int, claim_depth: int, scenario: Scenario
) -> None:
    """Both partitions in one transaction per batch (a block) or one each; one record of a key
    per claim, or up to four (published one per transaction, each settled before the next);
    publish failures, lost acknowledgements, rejections, storage failures before and after a
    settle. The broker checks, batch by batch, that every older record of a key was settled
    before a newer one went out (Harness.older_records_settled)."""
    asyncio.run(_check_scenario(scenario, per_transaction, claim_depth))


async def _check_scenario(s: Scenario, per_transaction: int, claim_depth: int) -> None:
    h = await Harness(
        batch_size=3,
        max_in_flight=4,
        max_attempts=MAX_ATTEMPTS,
        retry_backoff_max=0.001,
        sweep_interval=0.05,
        partitions_per_transaction=per_transaction,
        claim_depth=claim_depth,
    ).open()
    h.broker.script.extend(s.failures)
    h.storage.fail_calls = s.storage_failures
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
            held = {r.key for r in failed}
            if failed and all(r.key in held for r, _ in h.storage.rows):
                # Only parked records and the records they block are left: skip the parked.
                await operations(h).skip_failed([r.event_id for r in failed])
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
    [info] = await operations(h).list_records("failed", 10)
    assert (info.event_id, info.attempts, info.last_error) == (bad.event_id, 4, REJECTION)
    assert h.broker.ids() == [good.id]
    assert h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="rejected") == 4
    assert h.metric("outboxkit_relay_parked_total", topic=TOPIC) == 1
    await until(
        lambda: h.metric("outboxkit_relay_failed_records", topic=TOPIC, partition="0") == 1,
        "the failed-records gauge",
    )


async def test_the_retry_of_a_rejected_record_says_what_kafka_refused(make: MakeHarness) -> None:
    """The relay's "retrying after error" named an empty ``RetryLater: ``."""
    h = await make(partitions=1, max_attempts=3)
    bad = h.add(0, 0)
    h.broker.reject[bad.event_id] = None
    with structlog.testing.capture_logs() as logs:
        await h.start()
        await until(lambda: h.storage.state_of(bad) == "failed", "the bad record parked")
    retries = [e["error"] for e in logs if e["event"] == "retrying after error"]
    assert retries, logs
    expected = f"RetryLater: Kafka refused event {bad.event_id} of {TOPIC}/0: {REJECTION}"
    assert set(retries) == {expected}


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
    assert h.storage.state_of(behind) == "pending"  # its key is held back
    await until(
        lambda: h.metric("outboxkit_relay_backlog", topic=TOPIC, partition="0") == 1,
        "the backlog gauge",
    )

    if operator == "retry":
        assert await operations(h).retry_failed([bad.event_id]) == 1
        expected = [other.id, bad.id, behind.id]
    else:
        assert await operations(h).skip_failed([bad.event_id]) == 1
        expected = [other.id, behind.id]
    h.storage.signal_reconnect()
    await until(lambda: not h.storage.rows, "the key released")
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
