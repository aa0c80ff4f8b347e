"""The orders service on MongoDB: takes orders, each with an ``OrderPlaced`` event written in the
same multi-document transaction (the outbox), and marks them paid when ``PaymentCaptured``
arrives (the inbox). The same HTTP API as ``examples.orders_payments.orders``.

    OUTBOXKIT_DATABASE_URL='mongodb://127.0.0.1:27017/orders?replicaSet=rs0' \\
        uvicorn --factory examples.orders_payments_mongodb.orders:create_app --port 8001
"""

from typing import Annotated

from bson.decimal128 import Decimal128
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import REGISTRY, CollectorRegistry
from pymongo.asynchronous.client_session import AsyncClientSession

from examples.orders_payments.common import service_app
from examples.orders_payments.models import NewOrder, Order
from examples.orders_payments_mongodb.common import collection, collections
from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.fastapi import running
from outboxkit.inbox import Inbox
from outboxkit.service import Outboxkit

#: Handlers of this inbox run in a pymongo session, inside the transaction that records the
#: event id: mypy rejects one written for PostgreSQL.
inbox = Inbox[AsyncClientSession]("orders")


@inbox.handler(PaymentCaptured)
async def mark_paid(event: PaymentCaptured, tx: AsyncClientSession) -> None:
    await collection(tx, "orders").update_one(
        {"_id": event.order_id},
        {"$set": {"status": "paid", "payment_id": event.payment_id}},
        session=tx,
    )


def create_app(registry: CollectorRegistry = REGISTRY, *, workers: bool = True) -> FastAPI:
    """The app, for ``uvicorn --factory``; ``registry`` holds its Prometheus metrics.
    ``workers=False``: without its relay and inbox (a test runs them)."""
    schema = collections({"orders": []})
    app, kit = service_app("orders", OrderPlaced, inbox, registry, schema, workers=workers)
    Service = Annotated[Outboxkit[AsyncClientSession], Depends(running(kit))]  # 503 until started

    @app.post("/orders", status_code=201)
    async def place_order(new: NewOrder, service: Service) -> Order:
        event = new.place()
        order = Order.placed(event)

        async def work(tx: AsyncClientSession) -> None:
            document = order.model_dump() | {"_id": order.order_id}
            document |= {"amount": Decimal128(order.amount), "currency": order.currency.value}
            await collection(tx, "orders").insert_one(document, session=tx)
            await service.add(tx, event)

        # Retried from the start if MongoDB aborts it for a write conflict: two orders of one
        # customer (one key) at once conflict on purpose, which keeps their events in order.
        await service.run_transaction(work)
        return order

    @app.get("/orders/{order_id}")
    async def get_order(order_id: str, service: Service) -> Order:
        async with service.transaction() as tx:
            found = await collection(tx, "orders").find_one({"_id": order_id}, session=tx)
        if found is None:
            raise HTTPException(404, f"no order {order_id}")
        return Order.model_validate(found | {"amount": found["amount"].to_decimal()})

    return app
