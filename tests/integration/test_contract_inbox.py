"""The inbox store's contract on every backend of the repository — in memory, PostgreSQL and
MongoDB — through the suite outboxkit ships (outboxkit/testing/contract/inbox.py); and what the
suite leaves to each store, checked of outboxkit's own: a batch handler called once for a run."""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.inbox import Delivery
from outboxkit.schemas import Event
from outboxkit.testing.contract import InboxBackend, InboxStoreContract
from outboxkit.testing.contract.inbox import CONSUMER, RETENTION, Paid, deliveries
from tests.integration.backends import BackendCase


class Refunded(Event, type="contract.refunded", topic="contract", key_field="order"):
    order: str


class TestInboxStore(InboxStoreContract):
    @pytest.fixture
    def inbox_backend(self, backend_case: BackendCase) -> InboxBackend:
        return backend_case


async def test_a_batch_handler_is_called_once_for_a_run_of_its_type(
    backend_case: BackendCase,
) -> None:
    """outboxkit's stores call a batch handler once for each run of consecutive new events of
    its type (that is what makes it cheap: one command for many events); an event of another
    type between them ends the run, so a key's events keep their order across types."""
    paid = [Paid(order=f"p{i}") for i in range(5)]
    refund = Refunded(order="r")

    async def refunded(event: Refunded, tx: Any) -> None:
        await backend_case.write_effect(tx, event.order)

    calls: list[list[str]] = []
    batch = deliveries(backend_case, [paid[0], paid[1], paid[2], paid[3], paid[4]], calls=calls)
    run = [*batch[:2], Delivery(refund, refunded, "contract", 0, 2), *batch[2:]]
    async with backend_case.inbox_store(retention=RETENTION) as store:
        await store.process_batch(CONSUMER, batch[1:2])  # p1 recorded before
        calls.clear()
        outcome = await store.process_batch(CONSUMER, run)
    assert (outcome.ran, outcome.failed) == ([True, False, True, True, True, True], None)
    assert calls == [["p0"], ["p2", "p3", "p4"]]
    assert await backend_case.read_effects() == ["p1", "p0", "r", "p2", "p3", "p4"]
