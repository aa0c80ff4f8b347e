"""The inbox's delivery path (inbox/delivery.py) through its own interface,
``await path.deliver(tp, records, progress)``, with the in-memory store and a dead-letter producer
that keeps what it is sent: a partition's records take effect once each, in order (G5/G6); bad
input is dead-lettered and the partition goes on (G8); the offset never moves past a record whose
transaction did not commit, nor past one the dead-letter topic refuses for good (it parks)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox import HandlerRegistrationError, Inbox, InMemoryInboxStore
from outboxkit.inbox.delivery import DeliveryPath
from outboxkit.inbox.kafka import UnreadableRecord
from outboxkit.inbox.progress import PartitionProgress
from tests.helpers import holds_for, wait_for
from tests.unit.inbox_fakes import (
    TOPIC,
    TP,
    Charged,
    DeadLetterProducer,
    charging_inbox,
    metrics,
    record,
    settings,
)


def _path(
    store: InMemoryInboxStore,
    producer: DeadLetterProducer,
    inbox: Inbox[MemoryTransaction] | None = None,
    leaving: Callable[[], bool] = lambda: False,
    **overrides: object,
) -> tuple[DeliveryPath[MemoryTransaction], asyncio.Event]:
    stopping = asyncio.Event()
    inbox_metrics = metrics()
    path = DeliveryPath(
        inbox or charging_inbox(),
        settings(**overrides),
        store,
        dead_letters=producer.writer(inbox_metrics),
        stopping=stopping,
        metrics=inbox_metrics,
        leaving=leaving,
    )
    return path, stopping


async def test_a_redelivered_event_takes_effect_once_and_the_offset_passes_both() -> None:
    """Would catch a duplicate running its handler again (G5), or a redelivery left behind."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    path, _ = _path(store, producer, transaction_batch=2)
    first, second = Charged(order="a"), Charged(order="b")
    progress = PartitionProgress()
    records = [record(10, first), record(11, second), record(12, first), record(13, first)]

    assert await path.deliver(TP, records, progress)

    assert store.effects == [("charge", "a"), ("charge", "b")]
    assert progress.offset == 14
    assert producer.sent == []


@pytest.mark.parametrize("batch", [False, True], ids=["handler", "batch handler"])
async def test_bad_input_is_dead_lettered_and_the_records_around_it_take_effect_in_order(
    batch: bool,
) -> None:
    """Would catch bad input crashing the path or stopping the partition (G8), a dead letter
    without its reason, or the records after it skipped or reordered; with a batch handler, a
    raising batch that takes the good events down with it, or a bad event not singled out."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    path, _ = _path(store, producer, charging_inbox(batch=batch))
    unreadable = UnreadableRecord(TOPIC, 0, 3, 5, "CorruptRecordException: bad CRC")
    records = [
        record(0, Charged(order="a")),
        record(1, value=b"\xff not json"),
        record(2, Charged(order="b")),
        unreadable,
        record(5, Charged(order="bad")),  # its handler raises every time
        record(6, Charged(order="c")),
    ]
    progress = PartitionProgress()

    assert await path.deliver(TP, records, progress)

    assert store.effects == [("charge", "a"), ("charge", "b"), ("charge", "c")]
    reasons = producer.reasons()
    assert reasons[1:] == ["unreadable_record", "handler_failed"]
    assert reasons[0] != "handler_failed"  # the decoder's own reason
    assert {topic for topic, _, _ in producer.sent} == {f"{TOPIC}.dlq"}
    assert progress.offset == 7
    assert progress.parked is None


async def test_a_dead_letter_refused_for_good_parks_the_partition_at_that_record() -> None:
    """Would catch a record the dead-letter topic will never take being skipped (lost) or
    retried forever, or the records after it taking effect before it."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    producer.failures = [
        KafkaConnectionError("broker away"),  # retried
        TopicAuthorizationFailedError("no ACL"),  # for good
    ]
    path, _ = _path(store, producer)
    records = [
        record(0, Charged(order="a")),
        record(1, value=b"garbage"),
        record(2, Charged(order="b")),
    ]
    progress = PartitionProgress()

    assert not await path.deliver(TP, records, progress)

    assert store.effects == [("charge", "a")]
    assert progress.offset == 1
    assert progress.parked is not None
    assert "orders.dlq" in progress.parked
    # parked stays parked: nothing more is delivered for the partition
    assert not await path.deliver(TP, [record(3, Charged(order="c"))], progress)
    assert progress.offset == 1


async def test_the_offset_waits_while_the_database_is_away_then_the_record_takes_effect() -> None:
    """Would catch the offset moving past records whose transaction did not commit (G6: the
    committer would then commit them), or an outage dead-lettering them (not their fault)."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    path, _ = _path(store, producer)
    progress = PartitionProgress()
    store.unavailable = True
    delivering = asyncio.create_task(
        path.deliver(TP, [record(7, Charged(order="a")), record(8, Charged(order="b"))], progress)
    )
    await wait_for(lambda: not path.health.database_available, what="the outage seen")

    async def offset_held() -> None:
        assert progress.offset == 7

    await holds_for(0.05, offset_held, interval=0.01)  # through several retries
    assert path.health.last_error is not None

    store.unavailable = False
    assert await delivering

    assert store.effects == [("charge", "a"), ("charge", "b")]
    assert progress.offset == 9
    assert path.health.database_available
    assert producer.sent == []


async def test_stopping_during_an_outage_ends_the_delivery_without_moving_the_offset() -> None:
    """Would catch a stop hanging on an outage, or counting the undelivered records as done."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    path, stopping = _path(store, producer, retry_backoff_max=30)
    progress = PartitionProgress()
    store.unavailable = True
    delivering = asyncio.create_task(path.deliver(TP, [record(4, Charged(order="a"))], progress))
    await wait_for(lambda: not path.health.database_available, what="the outage seen")

    stopping.set()
    async with asyncio.timeout(5):
        assert await delivering  # not parked

    assert progress.offset == 4
    assert progress.parked is None
    assert store.effects == []


async def test_leaving_the_group_in_an_outage_ends_the_delivery_where_it_was() -> None:
    """A worker whose database has not answered for step_aside_after leaves its group at its
    next retry; the next owner reads the records again. Would catch a delivery that retries on
    (the worker never leaves), one that counts the records it did not take effect for as done
    (G6), or an outage not timed from its first failed transaction."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    leave = asyncio.Event()
    path, _ = _path(store, producer, leaving=leave.is_set)
    progress = PartitionProgress()
    store.unavailable = True
    began = time.monotonic()
    delivering = asyncio.create_task(
        path.deliver(TP, [record(4, Charged(order="a")), record(5, Charged(order="b"))], progress)
    )
    await wait_for(lambda: not path.health.database_available, what="the outage seen")
    await wait_for(
        lambda: (path.health.unavailable_for() or 0) >= 0.05, what="a few retries into the outage"
    )
    assert 0.05 <= (path.health.unavailable_for() or 0) <= time.monotonic() - began
    assert not delivering.done()

    leave.set()
    async with asyncio.timeout(5):
        assert await delivering  # not parked

    assert (progress.offset, progress.parked, store.effects) == (4, None, [])
    path.health.available()
    assert (path.health.database_available, path.health.unavailable_for()) == (True, None)


async def test_a_batch_handler_takes_a_run_of_new_events_in_one_call_each_once() -> None:
    """Would catch a batch handler called event by event (no gain), handed a duplicate (G6), or
    a run that crosses a batch of the transaction size."""
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    inbox = charging_inbox(batch=True)
    path, _ = _path(store, producer, inbox, transaction_batch=4)
    events = [Charged(order=str(i)) for i in range(6)]
    records = [record(i, e) for i, e in enumerate([*events[:3], events[1], *events[3:]])]

    assert await path.deliver(TP, records, PartitionProgress())

    assert store.effects == [("charge", str(i)) for i in range(6)]
    assert inbox.calls == [["0", "1", "2"], ["3", "4", "5"]]  # type: ignore[attr-defined]


def test_an_event_type_has_one_handler_of_either_kind() -> None:
    inbox = charging_inbox(batch=True)
    with pytest.raises(HandlerRegistrationError, match="Charged already has a handler"):
        inbox.handler(Charged)
    with pytest.raises(HandlerRegistrationError, match="not an Event subclass"):
        inbox.batch_handler(str)  # type: ignore[type-var]
    assert Charged in inbox.registry
    assert inbox.event_types == [Charged]
