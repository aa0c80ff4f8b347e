"""The orders service: an order placed over HTTP is one row and one OrderPlaced event, and the
event reaches Kafka once the relay has run."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest
from prometheus_client import CollectorRegistry

from examples.orders_payments import orders
from outboxkit.demo.events import Currency, OrderLine, OrderPlaced
from outboxkit.testing import OutboxkitHarness


async def test_an_order_is_published_once_the_relay_ran(
    outboxkit: OutboxkitHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await outboxkit.create_topics("shop.orders", "shop.payments")
    for name, value in outboxkit.environment().items():
        monkeypatch.setenv(name, value)
    app = orders.create_app(CollectorRegistry(), workers=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://o") as client,
    ):
        response = await client.post(
            "/orders",
            json={
                "customer_id": "c-1",
                "lines": [{"sku": "tea", "quantity": 2, "unit_price": "3.25"}],
            },
        )
    assert response.status_code == 201, response.text
    order_id = response.json()["order_id"]

    assert await outboxkit.published(OrderPlaced) == []  # committed, not yet published
    await outboxkit.run_relay_until_empty()
    [event] = await outboxkit.published(OrderPlaced)
    assert (event.order_id, event.customer_id, event.amount) == (order_id, "c-1", Decimal("6.50"))


async def test_order_events_survive_the_wire_in_memory(outboxkit_memory: OutboxkitHarness) -> None:
    """No server: the in-memory outbox, "published" by the harness, read back decoded."""
    await outboxkit_memory.create_topics("shop.orders")
    placed = OrderPlaced(
        order_id="o-1",
        customer_id="c-1",
        currency=Currency.EUR,
        lines=[OrderLine(sku="tea", quantity=2, unit_price=Decimal("3.25"))],
        amount=Decimal("6.50"),
    )
    async with outboxkit_memory.transaction() as tx:
        await outboxkit_memory.outbox.add(tx, placed)
    await outboxkit_memory.run_relay_until_empty()
    assert await outboxkit_memory.published(OrderPlaced) == [placed]
