"""The inbox's offset committer (inbox/offsets.py) through its own interface — ``partition``,
``commit``, ``skip_invisible``, ``pending`` and the revocation listener — against a consumer that
keeps every commit, and together with the delivery path on the in-memory store: an offset is
committed only once the store's transaction committed (G6), a revocation commits what the poll
in progress finished, and a failed commit is made again."""

from __future__ import annotations

import asyncio
import json
import time

from aiokafka.errors import CommitFailedError
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from outboxkit.inbox import InboxMetrics, InMemoryInboxStore
from outboxkit.inbox.delivery import DeliveryPath
from outboxkit.inbox.offsets import CommitOnRevoke, OffsetCommitter
from outboxkit.inbox.progress import troubled
from tests.helpers import holds_for, wait_for
from tests.unit.inbox_fakes import (
    TOPIC,
    TP,
    Charged,
    CommitLog,
    DeadLetterProducer,
    charging_inbox,
    metrics,
    record,
    settings,
)

OTHER = TopicPartition(TOPIC, 1)


def _committer(log: CommitLog) -> OffsetCommitter:
    return OffsetCommitter(log, settings(), inbox="payments", metrics=metrics())


async def test_an_offset_is_committed_only_after_the_store_transaction_committed() -> None:
    """Would catch an offset committed for records whose transaction had not committed: a crash
    then would lose them (G6)."""
    log, store, producer = CommitLog(ends={TP: 2}), InMemoryInboxStore(), DeadLetterProducer()
    committer = _committer(log)
    stopping, inbox_metrics = asyncio.Event(), metrics()
    path = DeliveryPath(
        charging_inbox(),
        settings(),
        store,
        dead_letters=producer.writer(inbox_metrics),
        stopping=stopping,
        metrics=inbox_metrics,
    )
    store.unavailable = True
    records = [record(0, Charged(order="a")), record(1, Charged(order="b"))]
    delivering = asyncio.create_task(path.deliver(TP, records, committer.partition(TP)))
    await wait_for(lambda: not path.health.database_available, what="the outage seen")

    await committer.commit()
    assert log.committed() == 0  # the first record, not past it

    store.unavailable = False
    await delivering
    await committer.commit()
    assert store.effects == [("charge", "a"), ("charge", "b")]
    assert log.committed() == 2


async def test_an_offset_is_committed_when_it_moved_and_its_progress_refreshed() -> None:
    """Would catch a partition without records committed at offset 0 (skipping what was never
    read), commits of unmoved offsets on every tick, or the progress metadata missing."""
    log = CommitLog(ends={TP: 10, OTHER: 5})
    committer = _committer(log)
    committer.partition(OTHER)  # assigned, nothing read yet: nothing to commit
    progress = committer.partition(TP)
    progress.advance(7)
    progress.error("handler failed: boom")

    await committer.commit()
    await committer.commit()  # nothing moved since, and the refresh is 5 s away

    assert len(log.commits) == 1
    [(tp, committed)] = log.commits[0].items()
    assert (tp, committed.offset) == (TP, 7)
    assert json.loads(committed.metadata)["error"] == "handler failed: boom"
    assert committer.pending() == {TP: 3}

    progress.advance(10)
    await committer.commit()
    assert log.committed() == 10


async def test_a_failed_commit_is_made_again() -> None:
    """Would catch an offset counted as committed when Kafka refused the commit (the next
    owner would then re-read more than needed; worse, a later commit would be skipped)."""
    log = CommitLog(ends={TP: 4}, failures=[CommitFailedError("rebalancing")])
    committer = _committer(log)
    committer.partition(TP).advance(4)

    await committer.commit()
    assert log.commits == []
    await committer.commit()
    assert log.committed() == 4


async def test_a_revocation_waits_for_the_poll_in_progress_then_commits_and_forgets() -> None:
    """Would catch a revocation committing before the poll in progress finished (its records'
    offsets lost to the next owner, redelivered), committing other partitions, or keeping the
    revoked partition's progress."""
    log = CommitLog(ends={TP: 9, OTHER: 9})
    committer = _committer(log)
    committer.partition(OTHER).advance(3)
    progress = committer.partition(TP)
    progress.advance(5)
    idle = asyncio.Event()  # a poll is being delivered
    listener = CommitOnRevoke(committer, idle)

    revoking = asyncio.create_task(listener.on_partitions_revoked({TP}))

    async def still_waiting() -> None:
        assert not revoking.done()
        assert log.commits == []

    await holds_for(0.05, still_waiting, interval=0.01)
    progress.advance(8)  # the poll in progress finishes its records
    idle.set()
    await revoking

    assert log.commits == [{TP: log.commits[0][TP]}]
    assert log.committed() == 8
    assert set(committer.partitions) == {OTHER}
    await listener.on_partitions_assigned({TP})
    assert committer.partitions[TP].offset is None


async def test_a_caught_up_partition_moves_past_transaction_markers_but_a_parked_one_does_not() -> (
    None
):
    """Would catch the offset of a caught-up partition staying before the markers (lag and
    commits one behind for ever), or a parked partition's offset moving past its stuck record."""
    log = CommitLog(ends={TP: 12, OTHER: 12}, past_markers={TP: 12, OTHER: 12})
    committer = _committer(log)
    committer.partition(TP).advance(11)
    parked = committer.partition(OTHER)
    parked.advance(4)
    parked.parked = "cannot write to orders.dlq"

    await committer.skip_invisible()

    assert committer.partitions[TP].offset == 12
    assert parked.offset == 4
    assert committer.pending() == {TP: 0, OTHER: 8}


async def test_a_partition_with_records_pending_and_no_progress_is_reported_stalled() -> None:
    """Would catch a stuck partition looking healthy (the stalled metric and the worker's
    health, which lists what :func:`troubled` returns), or a caught-up one reported stalled."""
    log = CommitLog(ends={TP: 10, OTHER: 6})
    registry = CollectorRegistry()
    committer = OffsetCommitter(
        log, settings(stall_after=1.0), inbox="payments", metrics=InboxMetrics(registry)
    )
    stuck = committer.partition(TP)
    stuck.advance(4)
    stuck.progress_at -= 30
    caught_up = committer.partition(OTHER)
    caught_up.advance(6)
    caught_up.progress_at -= 30

    await committer.commit()

    def stalled(partition: str) -> float | None:
        labels = {"inbox": "payments", "topic": TOPIC, "partition": partition}
        return registry.get_sample_value("outboxkit_inbox_stalled", labels)

    assert (stalled("0"), stalled("1")) == (1, 0)
    [state] = troubled(committer.partitions, committer.pending(), 1.0, time.time())
    assert (state.partition, state.offset, state.pending) == (f"{TOPIC}/0", 4, 6)


async def test_a_revoked_partition_exports_no_lag_stall_or_park_of_this_worker() -> None:
    """A partition another worker now owns: this worker's gauges for it read 0, not the lag it
    last saw, which a dashboard's max over workers would show for good (the gauge is never
    set again here) — found by #45's dashboard review."""
    log = CommitLog(ends={TP: 10})
    registry = CollectorRegistry()
    committer = OffsetCommitter(log, settings(), inbox="payments", metrics=InboxMetrics(registry))
    committer.partition(TP).advance(4)
    labels = {"inbox": "payments", "topic": TOPIC, "partition": "0"}
    assert committer.pending() == {TP: 6}
    assert registry.get_sample_value("outboxkit_inbox_lag", labels) == 6

    committer.forget({TP})

    for gauge in ("outboxkit_inbox_lag", "outboxkit_inbox_stalled", "outboxkit_inbox_parked"):
        assert registry.get_sample_value(gauge, labels) == 0, gauge
