"""The payments service: captures the payment of each ``OrderPlaced`` exactly once (the inbox)
and announces it with ``PaymentCaptured``, written by the handler in the same transaction (the
outbox, chained: inbox → handler → outbox).

    uvicorn --factory examples.orders_payments.payments:create_app --port 8002
"""

from pathlib import Path
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import REGISTRY, CollectorRegistry

from examples.orders_payments.common import service_app, sql_schema
from examples.orders_payments.models import Payment, capture
from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.fastapi import running
from outboxkit.inbox import Inbox
from outboxkit.relay import PostgresOutbox
from outboxkit.service import Outboxkit

inbox = Inbox("payments")
outbox = PostgresOutbox(source="urn:example:payments")


@inbox.handler(OrderPlaced)
async def capture_payment(event: OrderPlaced, tx: psycopg.AsyncConnection[Any]) -> None:
    captured = capture(event)
    await tx.execute(
        "INSERT INTO payments (payment_id, order_id, customer_id, amount, currency) "
        "VALUES (%s, %s, %s, %s, %s)",
        (
            captured.payment_id,
            event.order_id,
            event.customer_id,
            event.amount,
            event.currency.value,
        ),
    )
    await outbox.add(tx, captured)


def create_app(registry: CollectorRegistry = REGISTRY, *, workers: bool = True) -> FastAPI:
    """The app, for ``uvicorn --factory``; ``registry`` holds its Prometheus metrics.
    ``workers=False``: without its relay and inbox (its tests run them)."""
    schema = sql_schema(Path(__file__).with_name("payments.sql"))
    app, kit = service_app("payments", PaymentCaptured, inbox, registry, schema, workers=workers)

    @app.get("/payments/{order_id}")
    async def get_payment(
        order_id: str, service: Annotated[Outboxkit, Depends(running(kit))]
    ) -> Payment:
        async with service.transaction() as tx:
            cur = await tx.execute(
                "SELECT payment_id, order_id, amount FROM payments WHERE order_id = %s",
                (order_id,),
            )
            row = await cur.fetchone()
        if row is None:
            raise HTTPException(404, f"no payment for {order_id}")
        return Payment(payment_id=row[0], order_id=row[1], amount=row[2])

    return app
