"""The inbox store's contract (inbox/store.py), the same tests for every backend: in memory,
PostgreSQL and MongoDB. Handlers write their effect in the transaction they are given; the
tests read back what committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from outboxkit.inbox import Delivery, InboxSettings, InboxStore
from outboxkit.schemas import Event
from tests.integration.backends import BackendCase

CONSUMER = "contract"


class Paid(Event, type="contract.paid", topic="contract", key_field="order"):
    order: str


class HandlerError(Exception):
    pass


def settings(case: BackendCase, retention: timedelta = timedelta(days=1)) -> InboxSettings:
    return InboxSettings(database_url=case.url, topics=["contract"], inbox_retention=retention)


@pytest.fixture
async def store(backend_case: BackendCase) -> AsyncIterator[InboxStore[Any]]:
    async with backend_case.backend.inbox_store(settings(backend_case)) as opened:
        yield opened


def deliveries(
    case: BackendCase, events: list[Paid], *, failing: frozenset[str] = frozenset()
) -> list[Delivery[Any]]:
    def handler(event: Paid, tx: Any) -> Any:
        async def run() -> None:
            await case.write_effect(tx, event.order)
            if event.order in failing:
                raise HandlerError(event.order)

        return run()

    return [Delivery(e, handler, "contract", 0, offset) for offset, e in enumerate(events)]


async def test_each_event_takes_effect_once_g6(
    store: InboxStore[Any], backend_case: BackendCase
) -> None:
    one, two = Paid(order="1"), Paid(order="2")
    outcome = await store.process_batch(CONSUMER, deliveries(backend_case, [one, two, one]))
    assert outcome.ran == [True, True, False]
    assert outcome.failed is None
    again = await store.process_batch(CONSUMER, deliveries(backend_case, [two, one]))
    assert again.ran == [False, False]
    assert await backend_case.read_effects() == ["1", "2"]
    assert await store.count(CONSUMER) == 2


async def test_a_raising_handler_rolls_back_its_own_delivery_only(
    store: InboxStore[Any], backend_case: BackendCase
) -> None:
    events = [Paid(order=str(i)) for i in range(4)]
    outcome = await store.process_batch(
        CONSUMER, deliveries(backend_case, events, failing=frozenset({"2"}))
    )
    assert outcome.ran == [True, True]
    assert outcome.failed is not None
    index, error = outcome.failed
    assert index == 2
    assert isinstance(error, HandlerError)
    assert await backend_case.read_effects() == ["0", "1"]
    fixed = await store.process_batch(CONSUMER, deliveries(backend_case, events))
    assert fixed.ran == [False, False, True, True]
    assert await backend_case.read_effects() == ["0", "1", "2", "3"]


async def test_consumers_are_deduplicated_separately(
    store: InboxStore[Any], backend_case: BackendCase
) -> None:
    event = Paid(order="1")
    assert (await store.process_batch("a", deliveries(backend_case, [event]))).ran == [True]
    assert (await store.process_batch("b", deliveries(backend_case, [event]))).ran == [True]
    assert await store.count("a") == 1
    assert await store.count("b") == 1


async def test_two_workers_on_the_same_events_take_effect_once(backend_case: BackendCase) -> None:
    """A rebalance can hand the same records to two workers at once (G6)."""
    events = [Paid(order=str(i)) for i in range(20)]
    async with (
        backend_case.backend.inbox_store(settings(backend_case)) as first,
        backend_case.backend.inbox_store(settings(backend_case)) as second,
    ):
        outcomes = await asyncio.gather(
            first.process_batch(CONSUMER, deliveries(backend_case, events)),
            second.process_batch(CONSUMER, deliveries(backend_case, events[::-1])),
        )
    ran = [sum(o.ran) for o in outcomes]
    assert sum(ran) == 20
    assert sorted(await backend_case.read_effects(), key=int) == [str(i) for i in range(20)]


async def test_expired_records_are_purged_in_batches_and_then_run_again_g7(
    backend_case: BackendCase,
) -> None:
    async with backend_case.backend.inbox_store(
        settings(backend_case, retention=timedelta(seconds=0))
    ) as store:
        events = [Paid(order=str(i)) for i in range(5)]
        await store.process_batch(CONSUMER, deliveries(backend_case, events))
        assert await store.purge(timedelta(seconds=0), 3) == 3
        assert await store.purge(timedelta(seconds=0), 3) == 2
        assert await store.count(CONSUMER) == 0
        outcome = await store.process_batch(CONSUMER, deliveries(backend_case, events[:1]))
        assert outcome.ran == [True], "past the retention a duplicate takes effect again"
