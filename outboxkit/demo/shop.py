"""The demo's shop: an orders service and a payments service, each with its own tables, outbox
and inbox, in one PostgreSQL database (schema ``demo``).

    orders service   place_order: demo.orders row + OrderPlaced, one transaction
          │ relay → shop.orders
    payments service inbox "demo.payments": demo.payments row + PaymentCaptured, one transaction
          │ relay → shop.payments
    orders service   inbox "demo.orders": marks the order paid

Every arrow is at-least-once; every handler's effects happen once per event id.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import psycopg

from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured
from outboxkit.inbox import Inbox
from outboxkit.relay import PostgresOutbox

ORDERS_TOPIC = "shop.orders"
PAYMENTS_TOPIC = "shop.payments"
TOPICS = (ORDERS_TOPIC, PAYMENTS_TOPIC)
assert (OrderPlaced.event_topic, PaymentCaptured.event_topic) == TOPICS

SCHEMA = """
CREATE SCHEMA demo;
CREATE TABLE demo.orders (
    order_id    text PRIMARY KEY,
    customer_id text NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    placed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    paid_at     timestamptz
);
CREATE TABLE demo.payments (
    payment_id  text PRIMARY KEY,
    -- unique: a second charge for one order would fail loudly, not pass unnoticed
    order_id    text NOT NULL UNIQUE,
    amount      numeric(12, 2) NOT NULL,
    captured_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

orders_outbox = PostgresOutbox(source="urn:outboxkit-demo:orders")
payments_outbox = PostgresOutbox(source="urn:outboxkit-demo:payments")

#: The payments service consumes orders.
payments_inbox = Inbox("demo.payments")
#: The orders service consumes payments.
orders_inbox = Inbox("demo.orders")

_SKUS = {"tea": Decimal("4.50"), "mug": Decimal("12.00"), "kettle": Decimal("39.90")}


def order_id(index: int) -> str:
    return f"o-{index:06d}"


def customer_of(index: int, customers: int) -> str:
    return f"c-{index % customers:03d}"


def make_order(index: int, customers: int, rng: random.Random) -> OrderPlaced:
    """Order ``index``: customers take turns, so one customer's orders have increasing indexes."""
    lines = [
        OrderLine(sku=sku, quantity=rng.randint(1, 3), unit_price=_SKUS[sku])
        for sku in rng.sample(sorted(_SKUS), rng.randint(1, 2))
    ]
    return OrderPlaced(
        order_id=order_id(index),
        customer_id=customer_of(index, customers),
        currency=Currency.EUR,
        lines=lines,
        amount=sum((line.unit_price * line.quantity for line in lines), Decimal("0.00")),
    )


async def place_order(conn: psycopg.AsyncConnection[Any], order: OrderPlaced) -> None:
    """The orders service: the order row and its event commit together, or neither does."""
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO demo.orders (order_id, customer_id, amount) VALUES (%s, %s, %s)",
            (order.order_id, order.customer_id, order.amount),
        )
        await orders_outbox.add(conn, order)


@payments_inbox.handler(OrderPlaced)
async def capture_payment(event: OrderPlaced, tx: psycopg.AsyncConnection[Any]) -> None:
    """The payments service, in the inbox's transaction: charge once, and say so (chaining)."""
    payment_id = f"p-{event.order_id.removeprefix('o-')}"
    await tx.execute(
        "INSERT INTO demo.payments (payment_id, order_id, amount) VALUES (%s, %s, %s)",
        (payment_id, event.order_id, event.amount),
    )
    await payments_outbox.add(
        tx,
        PaymentCaptured(
            payment_id=payment_id,
            order_id=event.order_id,
            customer_id=event.customer_id,
            currency=event.currency,
            amount=event.amount,
        ),
    )


@orders_inbox.handler(PaymentCaptured)
async def mark_paid(event: PaymentCaptured, tx: psycopg.AsyncConnection[Any]) -> None:
    """The orders service learns that its order was paid."""
    await tx.execute(
        "UPDATE demo.orders SET paid_at = clock_timestamp() WHERE order_id = %s", (event.order_id,)
    )
