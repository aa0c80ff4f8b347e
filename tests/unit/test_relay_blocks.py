"""Blocks: several partitions in one Kafka transaction, and the fencing that keeps G4.

The plan (which blocks cover a relay's partitions) and the fence set (which transactional ids a
new owner initialises) are checked as properties; the engine is driven with fakes as in
test_relay_engine.py: one producer per block, fencing before the first read, no producer without
a confirmed membership, a fenced block that restarts only when the group confirms it, batches
sized by time, busy and idle declarations, and what operators see (slow stages, failures,
health).
"""

from __future__ import annotations

import asyncio
import time

import structlog
from hypothesis import given
from hypothesis import strategies as st

from outboxkit.relay.blocks import MAX_LEVEL, Block, containing, fence_ids, plan
from outboxkit.relay.records import TopicPartition
from tests.unit.relay_engine_harness import TOPIC, MakeHarness, make, tp, until

__all__ = ["make"]  # the fixture, from relay_engine_harness (shared with test_relay_engine*.py)

GROUP = "outboxkit.relay.default"


# -- the plan and the fence set ----------------------------------------------------------------


@given(
    count=st.integers(1, 80),
    data=st.data(),
    max_level=st.integers(0, MAX_LEVEL),
)
def test_blocks_cover_exactly_the_owned_partitions(
    count: int, data: st.DataObject, max_level: int
) -> None:
    owned = data.draw(st.sets(st.integers(0, count - 1)))
    tps = {TopicPartition(TOPIC, p) for p in owned}
    blocks = plan(tps, {TOPIC: count}, max_level)
    covered = [p for b in blocks for p in b.partitions(count)]
    assert sorted(covered, key=lambda t: t.partition) == sorted(tps, key=lambda t: t.partition)
    assert len(covered) == len(set(covered)), "a partition in two blocks"
    for block in blocks:
        assert block.level <= max_level
        for p in block.partitions(count):
            # A new owner of p fences the block p was published through.
            assert block in containing(p)
            assert block.transactional_id(GROUP) in fence_ids(GROUP, [p])
    assert plan(tps, {TOPIC: count}, max_level) == blocks  # deterministic


def test_blocks_are_as_large_as_owned_aligned_ranges_allow() -> None:
    six = {TOPIC: 6}
    everything = [tp(p) for p in range(6)]
    assert plan(everything, six, MAX_LEVEL) == [Block(TOPIC, 0, 3)]  # t/0-7: one transaction
    assert plan([tp(0), tp(1), tp(2)], six, MAX_LEVEL) == [Block(TOPIC, 0, 1), Block(TOPIC, 2, 0)]
    assert plan([tp(4), tp(5)], six, MAX_LEVEL) == [Block(TOPIC, 4, 1)]
    assert plan(everything, six, 1) == [Block(TOPIC, 0, 1), Block(TOPIC, 2, 1), Block(TOPIC, 4, 1)]
    assert plan(everything, six, 0) == [Block(TOPIC, p, 0) for p in range(6)]


def test_a_single_partition_block_keeps_the_id_of_earlier_versions() -> None:
    # Relays before blocks used <group>.<topic>.<partition>: a new owner fences them too.
    assert Block(TOPIC, 3, 0).transactional_id(GROUP) == f"{GROUP}.{TOPIC}.3"
    assert Block(TOPIC, 0, 3).transactional_id(GROUP) == f"{GROUP}.{TOPIC}.0-7"
    assert f"{GROUP}.{TOPIC}.3" in fence_ids(GROUP, [tp(3)])
    assert len(fence_ids(GROUP, [tp(3)])) == MAX_LEVEL + 1


# -- one transaction per block -----------------------------------------------------------------


async def test_one_producer_and_one_transaction_carry_every_partition(make: MakeHarness) -> None:
    h = await make(partitions=6, partitions_per_transaction=32)
    written = [h.add(p, key) for p in range(6) for key in range(2)]
    await h.start()
    await until(lambda: not h.storage.rows, "an empty outbox")

    [publisher] = h.broker.publishers
    assert publisher.block == Block(TOPIC, 0, 3)
    assert sorted(h.broker.ids()) == sorted(r.id for r in written)
    assert len({p for call in h.broker.calls for p in call.tps}) == 6
    assert h.broker.calls[0].tps == frozenset(tp(p) for p in range(6))  # all in one transaction
    # Before its first read, the relay fenced every other id that could carry its partitions.
    expected = fence_ids(GROUP, [tp(p) for p in range(6)]) - {f"{GROUP}.{TOPIC}.0-7"}
    assert set(h.broker.fenced_ids) == expected
    assert h.broker.violations == []


async def test_losing_a_partition_splits_the_block_and_fences_the_old_one(
    make: MakeHarness,
) -> None:
    h = await make(partitions=4, partitions_per_transaction=32)
    await h.start()
    await until(lambda: len(h.broker.publishers) == 1, "the block t/0-3")
    h.broker.fenced_ids.clear()

    await h.relay.revoke(frozenset({tp(3)}))
    old = h.broker.publishers[0]
    await until(lambda: len(h.broker.publishers) == 3, "blocks t/0-1 and t/2")
    assert old.closed
    assert {p.block for p in h.broker.publishers[1:]} == {Block(TOPIC, 0, 1), Block(TOPIC, 2, 0)}
    # The new blocks' first reads come after the old block's id is fenced: its producer, had it
    # not stopped, could not commit beside them.
    assert f"{GROUP}.{TOPIC}.0-3" in h.broker.fenced_ids
    assert f"{GROUP}.{TOPIC}.3" not in h.broker.fenced_ids  # not ours any more

    r = h.add(2)
    await until(lambda: r.id in h.broker.ids(), "t/2 through its own block")
    assert h.relay.health().owned == ["t/0", "t/1", "t/2"]


# -- membership before any producer --------------------------------------------------------------


async def test_no_producer_starts_until_the_group_confirms_the_membership(
    make: MakeHarness,
) -> None:
    h = await make(partitions=2, partitions_per_transaction=32, retry_backoff_max=0.02)
    confirmed = asyncio.Event()
    h.ownership.confirms = lambda _: confirmed.is_set()
    r = h.add(0)
    await h.start()
    await until(lambda: len(h.ownership.confirmations) >= 3, "confirmation asked again")
    assert h.broker.publishers == []  # a zombie never initialises a producer
    assert h.broker.fenced_ids == []

    confirmed.set()
    await until(lambda: h.broker.ids() == [r.id], "the record, once confirmed")
    assert h.ownership.confirmations[-1] == frozenset({tp(0), tp(1)})


async def test_a_producer_started_as_the_group_moved_on_is_never_used(
    make: MakeHarness,
) -> None:
    """Confirmed before the producer starts, not after (a rebalance completed in between):
    another relay may already publish these partitions, so this producer must not."""
    h = await make(partitions=2, partitions_per_transaction=32, retry_backoff_max=0.02)
    answers = iter([True, False])
    h.ownership.confirms = lambda _: next(answers, False)
    h.add(0)
    await h.start()
    await until(lambda: len(h.ownership.confirmations) >= 3, "asked again")
    [publisher] = h.broker.publishers
    assert publisher.started
    assert publisher.closed
    assert h.broker.calls == []


async def test_a_fenced_block_restarts_once_the_group_confirms_it_is_still_ours(
    make: MakeHarness,
) -> None:
    """A fence that raced a rebalance (the partitions came back to this relay) must not leave
    them unpublished until the next rebalance."""
    h = await make(partitions=2, partitions_per_transaction=32, heartbeat_interval=0.05)
    h.broker.script.append("fenced")
    first = h.add(0)
    await h.start()
    await until(lambda: h.broker.ids() == [first.id], "published after the fence")
    old, new = h.broker.publishers
    assert old.closed
    assert new.started
    assert h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="fenced") == 1
    assert h.relay.health().fenced == []


async def test_fencing_is_one_warning_line(make: MakeHarness) -> None:
    h = await make(partitions=1)
    h.ownership.confirms = lambda _: not h.broker.calls  # moved to another relay once fenced
    h.broker.always[tp(0)] = "fenced"
    h.add(0)
    with structlog.testing.capture_logs() as logs:
        await h.start()
        await until(
            lambda: (
                h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="fenced") > 0
            ),
            "fenced",
        )
    warnings = [e for e in logs if e["log_level"] in ("warning", "error")]
    assert [e["event"] for e in warnings] == [
        "partitions fenced: another relay publishes them now, or a transaction outlived "
        "OUTBOXKIT_TRANSACTION_TIMEOUT"
    ]
    assert "exc_info" not in warnings[0]


# -- batches sized by time -------------------------------------------------------------------


async def test_records_committed_meanwhile_share_the_next_transaction(make: MakeHarness) -> None:
    h = await make(partitions=6, partitions_per_transaction=32, batch_interval=0.3)
    await h.start()
    first = h.add(0)
    await until(lambda: first.id in h.broker.ids(), "the first record, at once")
    began = time.monotonic()
    more = [h.add(p, 1) for p in range(6)]  # within the interval: one batch
    await until(lambda: all(r.id in h.broker.ids() for r in more), "the next batch")
    assert time.monotonic() - began >= 0.2
    last = h.broker.calls[-1]
    assert sorted(last.ids) == sorted(r.id for r in more)


async def test_an_idle_relay_sends_at_once_despite_the_interval(make: MakeHarness) -> None:
    h = await make(partitions=2, partitions_per_transaction=32, batch_interval=1.0)
    await h.start()
    await until(lambda: h.storage.idle_looks(tp(0)) >= 1, "idle")
    await until(
        lambda: time.monotonic() - h.storage.fetches[-1].at > 1.0, "idle for an interval", within=5
    )
    began = time.monotonic()
    r = h.add(1)
    await until(lambda: r.id in h.broker.ids(), "the record")
    assert time.monotonic() - began < 0.9  # not the interval


async def test_sustained_load_stops_the_writers_notifications_and_idling_resumes_them(
    make: MakeHarness,
) -> None:
    h = await make(partitions=2, partitions_per_transaction=32, batch_interval=0.002)
    await h.start()
    await until(lambda: h.storage.declared == {tp(0), tp(1)}, "idle: declared waiting")

    stop = asyncio.Event()
    written = []

    async def writer() -> None:
        n = 0
        while not stop.is_set():
            written.append(h.add(n % 2, n % 20, n))
            n += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(writer())
    try:
        # Busy: the relay reads every cycle, so writers need not notify it.
        await until(lambda: h.storage.declared == set(), "busy: no longer declared")
    finally:
        stop.set()
        await task
    await until(lambda: not h.storage.rows, "drained")
    await until(lambda: h.storage.declared == {tp(0), tp(1)}, "idle again: declared")
    assert set(h.broker.ids()) == {r.id for r in written}


# -- what operators see ---------------------------------------------------------------------------


async def test_a_stage_running_long_is_logged_with_its_partitions(
    make: MakeHarness,
) -> None:
    h = await make(partitions=2, partitions_per_transaction=32, slow_after=0.2)
    h.broker.block()
    h.add(1)
    with structlog.testing.capture_logs() as logs:
        await h.start()
        await until(
            lambda: any(e["event"] == "relay stage running long" for e in logs),
            "the watch to notice",
            within=5,
        )
        h.broker.release()
        await until(lambda: any(e["event"] == "slow relay stage" for e in logs), "the end")
    running = next(e for e in logs if e["event"] == "relay stage running long")
    assert (running["stage"], running["partitions"]) == ("send", ["t/0", "t/1"])
    done = next(e for e in logs if e["event"] == "slow relay stage")
    assert done["stage"] == "send"
    assert done["seconds"] >= 0.2


async def test_a_failing_relay_warns_every_few_seconds_not_every_retry(make: MakeHarness) -> None:
    """The cadence itself, on a clock of the test's: test_relay_side_tasks.py."""
    h = await make(partitions=2, retry_backoff_max=0.01, metrics_interval=0.05)
    h.broker.always[tp(0)] = "error"  # the broker is unreachable for t/0
    h.add(0)
    with structlog.testing.capture_logs() as logs:
        await h.start()
        await until(lambda: len(h.broker.calls_to(tp(0))) >= 40, "many retries", within=10)
        await until(lambda: any(e["event"] == "cannot publish" for e in logs), "a warning")
    retries = [e for e in logs if e["event"] == "retrying after error"]
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert len(warned) < len(retries) / 4, "not one warning per retry"
    report = next(e for e in logs if e["event"] == "cannot publish")
    assert report["partitions"] == ["t/0"]
    assert report["backlog"] == 1
    assert "KafkaConnectionError" in report["error"]


async def test_health_shows_member_blocks_backlog_and_last_publish(make: MakeHarness) -> None:
    h = await make(partitions=2, partitions_per_transaction=32, metrics_interval=0.02)
    await h.start()
    r = h.add(1)
    await until(lambda: r.id in h.broker.ids(), "a record of t/1")
    h.broker.block()
    h.add(0)
    await until(lambda: [p.pending for p in h.relay.health().partitions] == [1, 0], "t/0's backlog")
    health = h.relay.health()
    assert health.member_id == "manual-member"
    first, second = health.partitions
    assert (first.partition, first.block, second.block) == ("t/0", "t/0-1", "t/0-1")
    assert first.last_publish_at is None
    assert second.last_publish_at is not None
    assert first.oldest_pending_age is not None
    assert first.oldest_pending_age >= 0
