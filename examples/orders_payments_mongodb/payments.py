"""The payments service on MongoDB: captures the payment of each ``OrderPlaced`` exactly once
(the inbox) and announces it with ``PaymentCaptured``, written by the handler in the same
multi-document transaction (the outbox, chained: inbox → handler → outbox). The same HTTP API as
``examples.orders_payments.payments``.

    OUTBOXKIT_DATABASE_URL='mongodb://127.0.0.1:27017/payments?replicaSet=rs0' \\
        uvicorn --factory examples.orders_payments_mongodb.payments:create_app --port 8002
"""

import functools
from typing import Annotated

from bson.decimal128 import Decimal128
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import REGISTRY, CollectorRegistry
from pymongo.asynchronous.client_session import AsyncClientSession

from examples.orders_payments.common import service_app
from examples.orders_payments.models import Payment, capture
from examples.orders_payments_mongodb.common import collection, collections
from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.fastapi import running
from outboxkit.inbox import Inbox
from outboxkit.relay import MongoOutbox
from outboxkit.service import Outboxkit

inbox = Inbox[AsyncClientSession]("payments")


@functools.cache
def outbox(database: str) -> MongoOutbox:
    """The service's outbox, in ``database`` (the one its payments are in)."""
    return MongoOutbox(source="urn:example:payments", database=database)


@inbox.handler(OrderPlaced)
async def capture_payment(event: OrderPlaced, tx: AsyncClientSession) -> None:
    captured = capture(event)
    payments = collection(tx, "payments")
    await payments.insert_one(
        {
            "_id": captured.payment_id,
            "order_id": event.order_id,
            "customer_id": event.customer_id,
            "amount": Decimal128(event.amount),
            "currency": event.currency.value,
        },
        session=tx,
    )
    await outbox(payments.database.name).add(tx, captured)


def create_app(registry: CollectorRegistry = REGISTRY, *, workers: bool = True) -> FastAPI:
    """The app, for ``uvicorn --factory``; ``registry`` holds its Prometheus metrics.
    ``workers=False``: without its relay and inbox (a test runs them)."""
    # One payment per order: the unique order_id is the business rule, the inbox's dedupe is
    # what keeps a redelivered OrderPlaced from even trying.
    schema = collections({"payments": [("order_id", True)]})
    app, kit = service_app("payments", PaymentCaptured, inbox, registry, schema, workers=workers)

    @app.get("/payments/{order_id}")
    async def get_payment(
        order_id: str,
        service: Annotated[Outboxkit[AsyncClientSession], Depends(running(kit))],
    ) -> Payment:
        async with service.transaction() as tx:
            found = await collection(tx, "payments").find_one({"order_id": order_id}, session=tx)
        if found is None:
            raise HTTPException(404, f"no payment for {order_id}")
        return Payment(
            payment_id=found["_id"], order_id=found["order_id"], amount=found["amount"].to_decimal()
        )

    return app
