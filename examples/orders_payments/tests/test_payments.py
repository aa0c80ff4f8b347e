"""The payments service's handler: an OrderPlaced is captured once — a redelivery is absorbed —
and its PaymentCaptured, written in the same transaction, is published by the relay."""

from __future__ import annotations

from decimal import Decimal

import psycopg

from examples.orders_payments import payments
from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured
from outboxkit.testing import OutboxkitHarness


def _order(order_id: str) -> OrderPlaced:
    return OrderPlaced(
        order_id=order_id,
        customer_id="c-1",
        currency=Currency.EUR,
        lines=[OrderLine(sku="tea", quantity=2, unit_price=Decimal("3.25"))],
        amount=Decimal("6.50"),
    )


async def test_a_payment_is_captured_once_and_announced(outboxkit: OutboxkitHarness) -> None:
    await outboxkit.create_topics("shop.orders", "shop.payments")
    placed = _order("o-7")
    assert await outboxkit.deliver(payments.inbox, placed) == [True]
    assert await outboxkit.deliver(payments.inbox, placed) == [False]  # a redelivery

    async with await psycopg.AsyncConnection.connect(outboxkit.database_url) as conn:
        cur = await conn.execute("SELECT payment_id, amount FROM payments")
        assert await cur.fetchall() == [("p-7", Decimal("6.50"))]

    await outboxkit.run_relay_until_empty()
    [captured] = await outboxkit.published(PaymentCaptured)
    assert (captured.payment_id, captured.order_id, captured.amount) == (
        "p-7",
        "o-7",
        Decimal("6.50"),
    )


async def test_orders_flow_through_kafka_to_the_payments_inbox(
    outboxkit: OutboxkitHarness,
) -> None:
    """The whole hop: outbox → relay → Kafka → inbox worker → handler → outbox."""
    await outboxkit.create_topics("shop.orders", "shop.payments")
    await outboxkit.add(_order("o-1"), _order("o-2"))
    await outboxkit.run_relay_until_empty()
    await outboxkit.run_inbox_until_idle(payments.inbox)
    await outboxkit.run_relay_until_empty()
    captured = await outboxkit.published(PaymentCaptured)
    assert sorted(c.order_id for c in captured) == ["o-1", "o-2"]
