"""The events of the demo's shop: orders are placed, payments are captured.

Shared by the demo, ``examples/orders_payments`` and the Spark pipeline's example job, so
that every consumer reads the very models the writer wrote.
"""

from decimal import Decimal
from enum import StrEnum

from pydantic import BaseModel, Field

from outboxkit.schemas import Event, EventRegistry

registry = EventRegistry()


class Currency(StrEnum):
    EUR = "EUR"
    USD = "USD"


class OrderLine(BaseModel):
    sku: str
    quantity: int = Field(gt=0)
    unit_price: Decimal = Field(ge=0, decimal_places=2)


@registry.register
class OrderPlaced(Event, type="shop.order_placed", topic="shop.orders", key_field="customer_id"):
    """A customer placed an order; keyed by customer so one customer's orders stay in order."""

    order_id: str
    customer_id: str
    currency: Currency
    lines: list[OrderLine]
    amount: Decimal = Field(ge=0, decimal_places=2)
    note: str | None = None


@registry.register
class PaymentCaptured(
    Event, type="shop.payment_captured", topic="shop.payments", key_field="order_id"
):
    """The payments service captured an order's amount."""

    payment_id: str
    order_id: str
    customer_id: str
    currency: Currency
    amount: Decimal = Field(ge=0, decimal_places=2)


__all__ = ["Currency", "OrderLine", "OrderPlaced", "PaymentCaptured", "registry"]
