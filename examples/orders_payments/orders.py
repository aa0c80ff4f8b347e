"""The orders service: takes orders, each with an ``OrderPlaced`` event written in the same
transaction (the outbox), and marks them paid when ``PaymentCaptured`` arrives (the inbox).

    uvicorn --factory examples.orders_payments.orders:create_app --port 8001

Settings: ``OUTBOXKIT_DATABASE_URL``, ``OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS`` and the other
``OUTBOXKIT_*`` variables (``outboxkit --help``, docs/configuration.md).
"""

from pathlib import Path
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import REGISTRY, CollectorRegistry

from examples.orders_payments.common import service_app, sql_schema
from examples.orders_payments.models import NewOrder, Order
from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.fastapi import running
from outboxkit.inbox import Inbox
from outboxkit.service import Outboxkit

inbox = Inbox("orders")


@inbox.handler(PaymentCaptured)
async def mark_paid(event: PaymentCaptured, tx: psycopg.AsyncConnection[Any]) -> None:
    await tx.execute(
        "UPDATE orders SET status = 'paid', payment_id = %s WHERE order_id = %s",
        (event.payment_id, event.order_id),
    )


def create_app(registry: CollectorRegistry = REGISTRY, *, workers: bool = True) -> FastAPI:
    """The app, for ``uvicorn --factory``; ``registry`` holds its Prometheus metrics.
    ``workers=False``: without its relay and inbox (its tests run them)."""
    schema = sql_schema(Path(__file__).with_name("orders.sql"))
    app, kit = service_app("orders", OrderPlaced, inbox, registry, schema, workers=workers)
    Service = Annotated[Outboxkit, Depends(running(kit))]  # 503 until started

    @app.post("/orders", status_code=201)
    async def place_order(new: NewOrder, service: Service) -> Order:
        event = new.place()
        async with service.transaction() as tx:
            await tx.execute(
                "INSERT INTO orders (order_id, customer_id, amount, currency) "
                "VALUES (%s, %s, %s, %s)",
                (event.order_id, event.customer_id, event.amount, event.currency.value),
            )
            await service.add(tx, event)
        return Order.placed(event)

    @app.get("/orders/{order_id}")
    async def get_order(order_id: str, service: Service) -> Order:
        async with service.transaction() as tx:
            cur = await tx.execute(
                "SELECT order_id, customer_id, amount, currency, status, payment_id "
                "FROM orders WHERE order_id = %s",
                (order_id,),
            )
            row = await cur.fetchone()
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        return Order(**dict(zip(Order.model_fields, row, strict=True)))

    return app
