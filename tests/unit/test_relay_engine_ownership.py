"""The relay engine against the in-memory outbox, fake publishers and a manual ownership
(tests/unit/relay_engine_harness.py): who publishes, when, and how it stops.

One publisher per partition with draining revocation (G4), wake on commit with a fallback
sweep (G5), flow control, the run's lifecycle and health. What is published and in which
order (G1, G2, G7, G8, retriable errors) is in test_relay_engine.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from outboxkit.core import supervisor
from outboxkit.relay.engine import RelayHealth
from outboxkit.relay.exceptions import OwnershipLostError, StorageUnavailableError
from tests.unit.relay_engine_harness import (
    TOPIC,
    MakeHarness,
    make,
    tp,
    until,
)

__all__ = ["make"]  # the fixture, from relay_engine_harness


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


# -- takeover: dead members leave the group at once ------------------------------------------


async def test_members_whose_database_session_ended_are_removed_from_the_group(
    make: MakeHarness,
) -> None:
    """The relay announces its own process, before it joins, and removes from the group
    exactly the members of the processes whose session ended, once each; a live one and one
    already gone from the group are left alone (the session timeout would otherwise hold every
    rebalance)."""
    h = await make(departed_check_interval=0.01)
    group = h.settings.group_id
    for member in ["dead", "alive", "left"]:
        await h.storage.announce_member(group, member)
    h.ownership.others = {"dead", "alive"}  # "left" is no longer in Kafka's group
    await h.start()
    await until(lambda: "manual-process" in h.storage.announced(group), "its own announcement")

    h.storage.end_session(group, "dead")
    h.storage.end_session(group, "left")
    await until(lambda: h.ownership.evicted == ["dead"], "the dead member removed")
    await until(lambda: "left" not in h.storage.announced(group), "the departed forgotten")
    assert h.ownership.others == {"alive"}
    assert h.metric("outboxkit_relay_departed_members_removed_total") == 1


async def test_the_process_is_announced_before_it_joins(make: MakeHarness) -> None:
    """A relay killed while its join is pending (after a broker restart, a replacement's whole
    life) can be removed for it only if it was announced: the announcement comes first."""
    h = await make(departed_check_interval=0.01)
    announced_at_join: list[list[str]] = []
    join = h.ownership.start

    async def start() -> dict[str, int]:
        announced_at_join.append(h.storage.announced(h.settings.group_id))
        return await join()

    h.ownership.start = start  # type: ignore[method-assign]
    await h.start()
    assert announced_at_join == [["manual-process"]]


async def test_a_check_that_fails_is_logged_and_the_relay_goes_on(
    make: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check only brings a removal sooner: a storage that refuses it (say, no privilege on
    the members' table) costs a warning, never the relay."""
    h = await make(departed_check_interval=0.01)
    calls = 0

    async def refuse(group: str, member_id: str) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("permission denied for table relay_members")

    monkeypatch.setattr(h.storage, "announce_member", refuse)
    await h.start()
    await until(lambda: calls >= 3, "the check tried again")
    h.add(0)
    await until(lambda: len(h.broker.ids()) == 1, "the relay still publishing")
    assert h.relay.health().running


@pytest.mark.parametrize(
    "settings",
    [{"departed_check_interval": 0}, {"departed_check_interval": 0.01, "instance_id": "relay-1"}],
    ids=["check-off", "static-membership"],
)
async def test_no_member_is_removed_with_the_check_off_or_static_membership(
    make: MakeHarness, settings: dict[str, Any]
) -> None:
    """A static member keeps its place while it restarts: removing it is the rebalance static
    membership avoids."""
    h = await make(**settings)
    await h.storage.announce_member(h.settings.group_id, "dead")
    h.storage.end_session(h.settings.group_id, "dead")
    h.ownership.others = {"dead"}
    await h.start()
    h.add(0)
    await until(lambda: len(h.broker.ids()) == 1, "a record published")
    # No check runs at all, so none can remove anybody later either.
    assert "departed" not in {task.get_name() for task in asyncio.all_tasks()}
    assert h.ownership.evicted == []
    assert h.storage.announced(h.settings.group_id) == ["dead"]


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


async def test_a_partition_worker_that_dies_is_restarted_and_the_others_go_on(
    make: MakeHarness,
) -> None:
    """G8, never a crash loop: an unexpected failure (a bug, or data nothing foresaw) in one
    block's worker is shown on the health and the block restarted with backoff; the relay does
    not exit and the other partitions keep publishing."""
    h = await make(partitions=2)
    h.broker.always[tp(0)] = "crash"
    poisoned, fine = h.add(0), h.add(1)
    await h.start()
    await until(lambda: fine.id in h.broker.ids(tp(1)), "partition 1 published")
    await until(
        lambda: h.metric("outboxkit_relay_publish_errors_total", topic=TOPIC, kind="crashed") >= 3,
        "the poisoned block restarted, again and again",
    )
    health = h.relay.health()
    assert health.running
    assert "a bug in the publisher" in (health.last_error or "")
    assert h.task is not None
    assert not h.task.done(), "the relay keeps running"
    del h.broker.always[tp(0)]
    await until(lambda: poisoned.id in h.broker.ids(tp(0)), "partition 0 published")
    await until(lambda: not h.relay.health().crashed, "no crashed partition left")


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


async def test_a_task_that_ignores_its_cancellation_is_left_behind() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # like a library call that swallows the cancellation

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait_for(supervisor.await_cancelled([task], grace=0.1), 2)
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
