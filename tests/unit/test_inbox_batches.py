"""Batch handlers through the inbox's delivery path (inbox/delivery.py) with the in-memory
store, as a property: any partition of events of two types — one with a batch handler, one with
a per-event handler — with duplicates, events whose handler always raises, and any transaction
batch size. Each good event takes effect once, in the order of the records (G5/G6); each bad
one is dead-lettered and the rest goes on (G8); a batch handler is only ever given a
contiguous run of new events of its own type."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox import InMemoryInboxStore
from outboxkit.inbox.delivery import DeliveryPath
from outboxkit.inbox.handlers import Inbox
from outboxkit.inbox.progress import PartitionProgress
from outboxkit.schemas import Event
from tests.unit.inbox_fakes import (
    TOPIC,
    TP,
    Charged,
    DeadLetterProducer,
    metrics,
    record,
)
from tests.unit.inbox_fakes import settings as inbox_settings


class Refunded(Event, type="Refunded", topic=TOPIC, key_field="order"):
    order: str


def _inbox(calls: list[list[UUID]]) -> Inbox[MemoryTransaction]:
    """Charged has a batch handler, Refunded a per-event one; an order starting with "bad"
    fails every time."""
    inbox = Inbox[MemoryTransaction]("payments")

    @inbox.batch_handler(Charged)
    async def charge(events: Sequence[Charged], tx: MemoryTransaction) -> None:
        for event in events:
            if event.order.startswith("bad"):
                raise ValueError("card declined")
            tx.record(event.order)
        calls.append([event.id for event in events])

    @inbox.handler(Refunded)
    async def refund(event: Refunded, tx: MemoryTransaction) -> None:
        if event.order.startswith("bad"):
            raise ValueError("refund refused")
        tx.record(event.order)

    return inbox


#: A record: (type: Charged or Refunded, index of a distinct event, bad).
_records = st.lists(
    st.tuples(st.booleans(), st.integers(0, 11), st.booleans()), min_size=1, max_size=25
)


@settings(max_examples=150, deadline=None)
@given(_records, st.integers(1, 8))
def test_batch_handlers_take_each_good_event_once_in_order(
    drawn: list[tuple[bool, int, bool]], transaction_batch: int
) -> None:
    # One event per distinct index; a redelivered index is the same event (a duplicate).
    events: dict[int, Event] = {}
    for charged, index, bad in drawn:
        if index not in events:
            order = f"{'bad' if bad else 'ok'}-{index}"
            events[index] = Charged(order=order) if charged else Refunded(order=order)
    sequence = [events[index] for _, index, _ in drawn]

    calls: list[list[UUID]] = []
    store, producer = InMemoryInboxStore(), DeadLetterProducer()
    path = DeliveryPath(
        _inbox(calls),
        inbox_settings(transaction_batch=transaction_batch),
        store,
        dead_letters=producer.writer(metrics()),
        stopping=asyncio.Event(),
        metrics=metrics(),
    )
    progress = PartitionProgress()
    records = [record(offset, event) for offset, event in enumerate(sequence)]

    assert asyncio.run(path.deliver(TP, records, progress))

    orders = [getattr(event, "order") for event in sequence]  # noqa: B009 - two event types
    good = list(dict.fromkeys(o for o in orders if o.startswith("ok")))
    assert store.effects == good, "each good event once, in the order of its first record"
    bad = [o for o in orders if o.startswith("bad")]  # never recorded: each copy fails again
    assert len(producer.sent) == len(bad)
    assert set(producer.reasons()) <= {"handler_failed"}
    assert progress.offset == len(records)
    first_offset: dict[UUID, int] = {}
    for offset, event in enumerate(sequence):
        first_offset.setdefault(event.id, offset)
    for call in calls:
        offsets = [first_offset[event_id] for event_id in call]
        assert offsets == sorted(set(offsets)), "a call's events are new, in record order"
        assert all(type(sequence[offset]) is Charged for offset in offsets)
