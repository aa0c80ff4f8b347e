"""The orders service: takes orders, each with an ``OrderPlaced`` event written in the same
transaction (the outbox), and marks them paid when ``PaymentCaptured`` arrives (the inbox).

    uvicorn --factory examples.orders_payments.orders:create_app --port 8001

Settings: ``OUTBOXKIT_DATABASE_URL``, ``OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS`` and the other
``OUTBOXKIT_*`` variables (``outboxkit --help``, docs/configuration.md).
"""

import uuid
from decimal import Decimal
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import REGISTRY, CollectorRegistry
from pydantic import BaseModel, Field

from examples.orders_payments.common import service_app
from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured
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


class NewOrder(BaseModel):
    customer_id: str
    currency: Currency = Currency.EUR
    lines: list[OrderLine] = Field(min_length=1)


class Order(BaseModel):
    order_id: str
    customer_id: str
    amount: Decimal
    currency: Currency
    status: str
    payment_id: str | None


def create_app(registry: CollectorRegistry = REGISTRY, *, workers: bool = True) -> FastAPI:
    """The app, for ``uvicorn --factory``; ``registry`` holds its Prometheus metrics.
    ``workers=False``: without its relay and inbox (its tests run them)."""
    app, kit = service_app("orders", OrderPlaced, inbox, registry, workers=workers)
    Service = Annotated[Outboxkit, Depends(running(kit))]  # 503 until started

    @app.post("/orders", status_code=201)
    async def place_order(new: NewOrder, service: Service) -> Order:
        amount = sum((line.unit_price * line.quantity for line in new.lines), Decimal("0.00"))
        order_id = f"o-{uuid.uuid4().hex[:12]}"
        async with service.transaction() as tx:
            await tx.execute(
                "INSERT INTO orders (order_id, customer_id, amount, currency) "
                "VALUES (%s, %s, %s, %s)",
                (order_id, new.customer_id, amount, new.currency.value),
            )
            await service.add(
                tx,
                OrderPlaced(
                    order_id=order_id,
                    customer_id=new.customer_id,
                    currency=new.currency,
                    lines=new.lines,
                    amount=amount,
                ),
            )
        return Order(
            order_id=order_id,
            customer_id=new.customer_id,
            amount=amount,
            currency=new.currency,
            status="placed",
            payment_id=None,
        )

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
