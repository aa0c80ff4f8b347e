"""The demo's shop on PostgreSQL: tables ``demo.orders`` and ``demo.payments`` beside outboxkit's
schema, so each service's writes and its events commit in one transaction."""

from __future__ import annotations

from typing import Any

import psycopg

from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.demo.shop import (
    ORDERS_INBOX,
    PAYMENTS_INBOX,
    PAYMENTS_SOURCE,
    WARMUP_ORDER,
    ShopCounts,
    payment_for,
)
from outboxkit.inbox import Inbox
from outboxkit.relay import PostgresOutbox

Connection = psycopg.AsyncConnection[Any]

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

payments_outbox = PostgresOutbox(source=PAYMENTS_SOURCE)
payments_inbox = Inbox(PAYMENTS_INBOX)
orders_inbox = Inbox(ORDERS_INBOX)


@payments_inbox.handler(OrderPlaced)
async def capture_payment(event: OrderPlaced, tx: Connection) -> None:
    """The payments service, in the inbox's transaction: charge once, and say so (chaining)."""
    payment = payment_for(event)
    await tx.execute(
        "INSERT INTO demo.payments (payment_id, order_id, amount) VALUES (%s, %s, %s)",
        (payment.payment_id, event.order_id, event.amount),
    )
    await payments_outbox.add(tx, payment)


@orders_inbox.handler(PaymentCaptured)
async def mark_paid(event: PaymentCaptured, tx: Connection) -> None:
    """The orders service learns that its order was paid."""
    await tx.execute(
        "UPDATE demo.orders SET paid_at = clock_timestamp() WHERE order_id = %s", (event.order_id,)
    )


class PostgresShop:
    """:class:`~outboxkit.demo.shop.Shop` on PostgreSQL: each ``tx`` is a connection in a
    transaction of the orders service's ``Outboxkit``."""

    payments_inbox = payments_inbox
    orders_inbox = orders_inbox

    async def create(self, tx: Connection) -> None:
        await tx.execute(SCHEMA)

    async def insert_order(self, tx: Connection, order: OrderPlaced) -> None:
        await tx.execute(
            "INSERT INTO demo.orders (order_id, customer_id, amount) VALUES (%s, %s, %s)",
            (order.order_id, order.customer_id, order.amount),
        )

    async def counts(self, tx: Connection) -> ShopCounts:
        cur = await tx.execute(
            """
            SELECT (SELECT count(*) FROM demo.orders),
                   (SELECT count(*) FROM demo.payments),
                   (SELECT count(*) FROM demo.orders WHERE paid_at IS NOT NULL)
            """
        )
        row = await cur.fetchone()
        assert row is not None
        return ShopCounts(*row)

    async def latencies(self, tx: Connection, limit: int | None) -> tuple[list[float], list[float]]:
        cur = await tx.execute(
            """
            SELECT extract(epoch FROM p.captured_at - o.placed_at)::float8,
                   extract(epoch FROM o.paid_at - o.placed_at)::float8
            FROM demo.payments p JOIN demo.orders o USING (order_id)
            WHERE o.order_id <> %s
            ORDER BY p.captured_at DESC
            LIMIT %s
            """,
            (WARMUP_ORDER, limit),
        )
        rows = await cur.fetchall()
        return [r[0] for r in rows], [r[1] for r in rows if r[1] is not None]
