"""The inbox store's contract (:class:`~outboxkit.inbox.InboxStore`): what every backend must
do, proven on a real database.

Handlers write their effect in the transaction their store gives them
(:meth:`~outboxkit.testing.contract.InboxBackend.write_effect`); the tests read back what
committed. Subclass :class:`InboxStoreContract` in a test module and give it an
``inbox_backend`` fixture (:class:`~outboxkit.testing.contract.InboxBackend`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio

from outboxkit.inbox import Delivery, InboxStore
from outboxkit.schemas import Event
from outboxkit.testing.contract.backend import InboxBackend

CONSUMER = "contract"
RETENTION = timedelta(days=1)


class Paid(Event, type="contract.paid", topic="contract", key_field="order"):
    order: str


class HandlerError(Exception):
    pass


def deliveries(
    backend: InboxBackend,
    events: list[Paid],
    *,
    failing: frozenset[str] = frozenset(),
    calls: list[list[str]] | None = None,
) -> list[Delivery[Any]]:
    """``events`` as deliveries at offsets 0, 1, …; each handler writes its event's order, then
    raises if that order is in ``failing``. With ``calls``, their type has a batch handler
    (:attr:`~outboxkit.inbox.Delivery.batch`) that writes each event's order, raises if one is
    in ``failing``, and appends the orders of each call that returned to ``calls``; each
    delivery's ``handler`` calls it with its event alone, as the inbox's registration does."""

    async def batch(events: Sequence[Paid], tx: Any) -> None:
        for event in events:
            await backend.write_effect(tx, event.order)
        if failing & {event.order for event in events}:
            raise HandlerError(",".join(event.order for event in events))
        if calls is not None:
            calls.append([event.order for event in events])

    def handler(event: Paid, tx: Any) -> Awaitable[None]:
        if calls is not None:
            return batch([event], tx)

        async def run() -> None:
            await backend.write_effect(tx, event.order)
            if event.order in failing:
                raise HandlerError(event.order)

        return run()

    return [
        Delivery(e, handler, "contract", 0, offset, batch=batch if calls is not None else None)
        for offset, e in enumerate(events)
    ]


@pytest.mark.asyncio
class InboxStoreContract:
    """The inbox store contract. Needs an ``inbox_backend`` fixture: one fresh database of the
    backend per test."""

    @pytest_asyncio.fixture
    async def store(self, inbox_backend: InboxBackend) -> AsyncIterator[InboxStore[Any]]:
        async with inbox_backend.inbox_store(retention=RETENTION) as opened:
            yield opened

    async def test_each_event_takes_effect_once_g6(
        self, store: InboxStore[Any], inbox_backend: InboxBackend
    ) -> None:
        one, two = Paid(order="1"), Paid(order="2")
        outcome = await store.process_batch(CONSUMER, deliveries(inbox_backend, [one, two, one]))
        assert outcome.ran == [True, True, False]
        assert outcome.failed is None
        again = await store.process_batch(CONSUMER, deliveries(inbox_backend, [two, one]))
        assert again.ran == [False, False]
        assert await inbox_backend.read_effects() == ["1", "2"]
        assert await store.count(CONSUMER) == 2

    @pytest.mark.parametrize("batch", [False, True], ids=["handler", "batch handler"])
    async def test_a_raising_handler_rolls_back_its_own_delivery_only(
        self, store: InboxStore[Any], inbox_backend: InboxBackend, batch: bool
    ) -> None:
        """Exactly the deliveries before the failing one commit, and the store reports it; with
        a batch handler that raises for one of its events, the same (a store that called it with
        several redoes them to find which)."""
        events = [Paid(order=str(i)) for i in range(4)]
        calls: list[list[str]] | None = [] if batch else None
        outcome = await store.process_batch(
            CONSUMER, deliveries(inbox_backend, events, failing=frozenset({"2"}), calls=calls)
        )
        assert outcome.ran == [True, True]
        assert outcome.failed is not None
        index, error = outcome.failed
        assert index == 2
        assert isinstance(error, HandlerError)
        assert await inbox_backend.read_effects() == ["0", "1"]
        fixed = await store.process_batch(CONSUMER, deliveries(inbox_backend, events, calls=calls))
        assert fixed.ran == [False, False, True, True]
        assert await inbox_backend.read_effects() == ["0", "1", "2", "3"]

    async def test_a_batch_handler_takes_each_new_event_once_in_order(
        self, store: InboxStore[Any], inbox_backend: InboxBackend
    ) -> None:
        """Deliveries whose type has a batch handler: the store may call it once for a run of
        them (outboxkit's stores do) or event by event; either way each new event takes effect
        once, in order, and it never sees a duplicate — recorded before, or twice in the
        batch."""
        one, two, three = Paid(order="1"), Paid(order="2"), Paid(order="3")
        calls: list[list[str]] = []
        first = await store.process_batch(CONSUMER, deliveries(inbox_backend, [two], calls=calls))
        assert first.ran == [True]
        outcome = await store.process_batch(
            CONSUMER, deliveries(inbox_backend, [one, two, three, one], calls=calls)
        )
        assert (outcome.ran, outcome.failed) == ([True, False, True, False], None)
        assert await inbox_backend.read_effects() == ["2", "1", "3"]
        assert [order for call in calls for order in call] == ["2", "1", "3"]

    async def test_consumers_are_deduplicated_separately(
        self, store: InboxStore[Any], inbox_backend: InboxBackend
    ) -> None:
        event = Paid(order="1")
        assert (await store.process_batch("a", deliveries(inbox_backend, [event]))).ran == [True]
        assert (await store.process_batch("b", deliveries(inbox_backend, [event]))).ran == [True]
        assert await store.count("a") == 1
        assert await store.count("b") == 1

    async def test_a_store_whose_database_answers_pings(self, store: InboxStore[Any]) -> None:
        """A worker that left its group while its transactions failed rejoins once this
        returns (OUTBOXKIT_STEP_ASIDE_AFTER); it must not touch the inbox's records."""
        await store.ping()
        assert await store.count(CONSUMER) == 0

    async def test_two_workers_on_the_same_events_take_effect_once(
        self, inbox_backend: InboxBackend
    ) -> None:
        """A rebalance can hand the same records to two workers at once (G6)."""
        events = [Paid(order=str(i)) for i in range(20)]
        async with (
            inbox_backend.inbox_store(retention=RETENTION) as first,
            inbox_backend.inbox_store(retention=RETENTION) as second,
        ):
            outcomes = await asyncio.gather(
                first.process_batch(CONSUMER, deliveries(inbox_backend, events)),
                second.process_batch(CONSUMER, deliveries(inbox_backend, events[::-1])),
            )
        ran = [sum(o.ran) for o in outcomes]
        assert sum(ran) == 20
        assert sorted(await inbox_backend.read_effects(), key=int) == [str(i) for i in range(20)]

    async def test_expired_records_are_purged_in_batches_and_then_run_again_g7(
        self, inbox_backend: InboxBackend
    ) -> None:
        async with inbox_backend.inbox_store(retention=timedelta(seconds=0)) as store:
            events = [Paid(order=str(i)) for i in range(5)]
            await store.process_batch(CONSUMER, deliveries(inbox_backend, events))
            assert await store.purge(timedelta(seconds=0), 3) == 3
            assert await store.purge(timedelta(seconds=0), 3) == 2
            assert await store.count(CONSUMER) == 0
            outcome = await store.process_batch(CONSUMER, deliveries(inbox_backend, events[:1]))
            assert outcome.ran == [True], "past the retention a duplicate takes effect again"
