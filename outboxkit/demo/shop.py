"""The demo's shop: an orders service and a payments service, each with its own tables (or
collections), outbox and inbox, in one database — PostgreSQL (:mod:`.shop_postgres`) or MongoDB
(:mod:`.shop_mongodb`). What both share is here: the topics, the orders, and the :class:`Shop`
that the demo's runner calls inside the transactions of the services' ``Outboxkit``.

    orders service   place_order: demo.orders row + OrderPlaced, one transaction
          │ relay → shop.orders
    payments service inbox "demo.payments": demo.payments row + PaymentCaptured, one transaction
          │ relay → shop.payments
    orders service   inbox "demo.orders": marks the order paid

Every arrow is at-least-once; every handler's effects happen once per event id.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from outboxkit import ConfigurationError
from outboxkit.backends import backend_for
from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured
from outboxkit.inbox import Inbox

ORDERS_TOPIC = "shop.orders"
PAYMENTS_TOPIC = "shop.payments"
TOPICS = (ORDERS_TOPIC, PAYMENTS_TOPIC)
assert (OrderPlaced.event_topic, PaymentCaptured.event_topic) == TOPICS

#: The consumers: the payments service consumes orders, the orders service consumes payments.
PAYMENTS_INBOX = "demo.payments"
ORDERS_INBOX = "demo.orders"
#: The producing services (the events' ``ce_source``).
ORDERS_SOURCE = "urn:outboxkit-demo:orders"
PAYMENTS_SOURCE = "urn:outboxkit-demo:payments"

_SKUS = {"tea": Decimal("4.50"), "mug": Decimal("12.00"), "kettle": Decimal("39.90")}


def order_id(index: int) -> str:
    return f"o-{index:06d}"


#: Placed and waited for before the others: it shows the pipeline is ready (left out of latencies).
WARMUP_ORDER = order_id(0)


def payment_id(order: str) -> str:
    return f"p-{order.removeprefix('o-')}"


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


def payment_for(event: OrderPlaced) -> PaymentCaptured:
    """What the payments service announces once it charged ``event``'s order."""
    return PaymentCaptured(
        payment_id=payment_id(event.order_id),
        order_id=event.order_id,
        customer_id=event.customer_id,
        currency=event.currency,
        amount=event.amount,
    )


@dataclass(frozen=True, slots=True)
class ShopCounts:
    """What the shop's own tables say, read at one snapshot."""

    orders: int = 0
    payments: int = 0
    paid: int = 0

    @property
    def written(self) -> int:
        """Events written: each order's ``OrderPlaced``, each payment's ``PaymentCaptured``."""
        return self.orders + self.payments

    @property
    def handled(self) -> int:
        """Events that took effect: an order's became a payment, a payment's a paid order."""
        return self.payments + self.paid


class Shop(Protocol):
    """The services' own code on one database: their tables or collections, the two inboxes'
    handlers, and the queries the demo reads back to check that nothing was lost. Each method
    runs in a transaction ``tx`` of the orders service's ``Outboxkit``."""

    #: The payments service's inbox (``OrderPlaced`` → a payment + ``PaymentCaptured``).
    payments_inbox: Inbox[Any]
    #: The orders service's inbox (``PaymentCaptured`` → the order is paid).
    orders_inbox: Inbox[Any]

    async def create(self, tx: Any) -> None:
        """The shop's own tables or collections, in a new database."""

    async def insert_order(self, tx: Any, order: OrderPlaced) -> None:
        """The orders service's row of ``order`` (its event is added in the same ``tx``)."""

    async def counts(self, tx: Any) -> ShopCounts: ...

    async def latencies(self, tx: Any, limit: int | None) -> tuple[list[float], list[float]]:
        """Seconds from each order's commit to its payment's commit, and to its paid mark, most
        recent payments first (at most ``limit``); the warm-up order, which waited for the
        consumer groups, is left out."""


def shop_for(url: str) -> Shop:
    """The shop's code for the database at ``url``; only that database's driver is imported."""
    kind = backend_for(url).kind
    if kind == "postgresql":
        from outboxkit.demo.shop_postgres import PostgresShop  # noqa: PLC0415

        return PostgresShop()
    if kind == "mongodb":
        from outboxkit.demo.shop_mongodb import MongoShop  # noqa: PLC0415

        return MongoShop(url)
    raise ConfigurationError(f"the demo's shop runs on PostgreSQL or MongoDB, not {kind}")
