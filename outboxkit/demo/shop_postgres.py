"""The demo's shop on PostgreSQL: tables ``demo.orders`` and ``demo.payments`` beside outboxkit's
schema, so each service's writes and its events commit in one transaction."""

from __future__ import annotations

from typing import Any

import psycopg

from outboxkit.backends import Transactions
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
    """:class:`~outboxkit.demo.shop.Shop` on PostgreSQL; ``transactions`` come from
    :func:`outboxkit.backends.backend_for` (a pool, and the orders service's outbox writer)."""

    payments_inbox = payments_inbox
    orders_inbox = orders_inbox

    def __init__(self, transactions: Transactions) -> None:
        self._transactions = transactions

    async def create(self) -> None:
        async with self._transactions.transaction() as conn:
            await conn.execute(SCHEMA)

    async def place_order(self, order: OrderPlaced) -> None:
        async with self._transactions.transaction() as conn:
            await conn.execute(
                "INSERT INTO demo.orders (order_id, customer_id, amount) VALUES (%s, %s, %s)",
                (order.order_id, order.customer_id, order.amount),
            )
            await self._transactions.outbox.add(conn, order)

    async def counts(self) -> ShopCounts:
        row = await self._one(
            """
            SELECT (SELECT count(*) FROM demo.orders),
                   (SELECT count(*) FROM demo.payments),
                   (SELECT count(*) FROM demo.orders WHERE paid_at IS NOT NULL)
            """
        )
        return ShopCounts(*row)

    async def latencies(self, limit: int | None = None) -> tuple[list[float], list[float]]:
        async with self._transactions.transaction() as conn:
            cur = await conn.execute(
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

    async def is_paid(self, order: str) -> bool:
        row = await self._one(
            "SELECT count(*) FROM demo.orders WHERE order_id = %s AND paid_at IS NOT NULL",
            (order,),
        )
        return bool(row[0])

    async def _one(self, query: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        async with self._transactions.transaction() as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
        assert row is not None
        return tuple(row)
