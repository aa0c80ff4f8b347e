"""The services' HTTP models, shared by the PostgreSQL services (this package) and the MongoDB
ones (``examples.orders_payments_mongodb``): the same API whatever the database."""

from __future__ import annotations

import uuid
from decimal import Decimal

from pydantic import BaseModel, Field

from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured


class NewOrder(BaseModel):
    customer_id: str
    currency: Currency = Currency.EUR
    lines: list[OrderLine] = Field(min_length=1)

    def place(self) -> OrderPlaced:
        """The order as placed: a new id, its amount, and the event that announces it."""
        return OrderPlaced(
            order_id=f"o-{uuid.uuid4().hex[:12]}",
            customer_id=self.customer_id,
            currency=self.currency,
            lines=self.lines,
            amount=sum((line.unit_price * line.quantity for line in self.lines), Decimal("0.00")),
        )


class Order(BaseModel):
    order_id: str
    customer_id: str
    amount: Decimal
    currency: Currency
    status: str
    payment_id: str | None

    @classmethod
    def placed(cls, event: OrderPlaced) -> Order:
        return cls(
            order_id=event.order_id,
            customer_id=event.customer_id,
            amount=event.amount,
            currency=event.currency,
            status="placed",
            payment_id=None,
        )


class Payment(BaseModel):
    payment_id: str
    order_id: str
    amount: Decimal


def capture(event: OrderPlaced) -> PaymentCaptured:
    """What the payments service announces when it captured ``event``'s amount."""
    return PaymentCaptured(
        payment_id=f"p-{event.order_id.removeprefix('o-')}",
        order_id=event.order_id,
        customer_id=event.customer_id,
        currency=event.currency,
        amount=event.amount,
    )
