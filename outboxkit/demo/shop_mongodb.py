"""The demo's shop on MongoDB: collections ``demo.orders`` and ``demo.payments`` beside outboxkit's
(``outboxkit.outbox``, …) in one database, so each service's writes and its events commit in one
multi-document transaction.

Times are the client's clock (one machine here): MongoDB has no server-side default for a field,
and its dates keep milliseconds, which is the resolution the demo's latencies are shown in.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.uri_parser import parse_uri

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
from outboxkit.relay import MongoOutbox

ORDERS = "demo.orders"
PAYMENTS = "demo.payments"


def _database(tx: AsyncClientSession) -> AsyncDatabase[dict[str, Any]]:
    """The database the URL names: the shop's collections are beside outboxkit's there."""
    return tx.client.get_default_database()


async def _insert(
    tx: AsyncClientSession, collection: str, id_: str, amount: Decimal, at: str, **fields: str
) -> None:
    """A row of the shop: its id, its amount, when (``at``), and ``fields``."""
    document = {"_id": id_, **fields, "amount": Decimal128(amount), at: datetime.now(UTC)}
    await _database(tx)[collection].insert_one(document, session=tx)


class MongoShop:
    """:class:`~outboxkit.demo.shop.Shop` on MongoDB, in the database ``url`` names: each ``tx``
    is a session in a transaction (of the orders service's ``Outboxkit``, or of an inbox)."""

    def __init__(self, url: str) -> None:
        database = parse_uri(url)["database"]
        self._payments_outbox = MongoOutbox(source=PAYMENTS_SOURCE, database=database)
        self.payments_inbox = Inbox[AsyncClientSession](PAYMENTS_INBOX)
        self.payments_inbox.handler(OrderPlaced)(self.capture_payment)
        self.orders_inbox = Inbox[AsyncClientSession](ORDERS_INBOX)
        self.orders_inbox.handler(PaymentCaptured)(self.mark_paid)

    # -- the services ------------------------------------------------------------------------

    async def capture_payment(self, event: OrderPlaced, tx: AsyncClientSession) -> None:
        """The payments service, in the inbox's transaction: charge once, and say so (chaining)."""
        payment = payment_for(event)
        await _insert(
            tx, PAYMENTS, payment.payment_id, event.amount, "captured_at", order_id=event.order_id
        )
        await self._payments_outbox.add(tx, payment)

    async def mark_paid(self, event: PaymentCaptured, tx: AsyncClientSession) -> None:
        """The orders service learns that its order was paid."""
        await _database(tx)[ORDERS].update_one(
            {"_id": event.order_id}, {"$set": {"paid_at": datetime.now(UTC)}}, session=tx
        )

    async def insert_order(self, tx: AsyncClientSession, order: OrderPlaced) -> None:
        await _insert(
            tx, ORDERS, order.order_id, order.amount, "placed_at", customer_id=order.customer_id
        )

    # -- the demo's side ---------------------------------------------------------------------

    async def create(self, tx: AsyncClientSession) -> None:
        """The collections exist before the orders' transactions (creating one inside concurrent
        transactions conflicts); a payment's order is unique, as on PostgreSQL: a second charge
        for one order would fail loudly, not pass unnoticed."""
        db = _database(tx)
        await db.create_collection(ORDERS, session=tx)
        payments = await db.create_collection(PAYMENTS, session=tx)
        await payments.create_index("order_id", unique=True, name="payments_order_id", session=tx)

    async def counts(self, tx: AsyncClientSession) -> ShopCounts:
        """Read in one transaction, so from one snapshot."""
        db = _database(tx)
        return ShopCounts(
            orders=await db[ORDERS].count_documents({}, session=tx),
            payments=await db[PAYMENTS].count_documents({}, session=tx),
            paid=await db[ORDERS].count_documents({"paid_at": {"$exists": True}}, session=tx),
        )

    async def latencies(
        self, tx: AsyncClientSession, limit: int | None
    ) -> tuple[list[float], list[float]]:
        pipeline: list[dict[str, Any]] = [
            {"$match": {"order_id": {"$ne": WARMUP_ORDER}}},
            {"$sort": {"captured_at": -1}},
            *([{"$limit": limit}] if limit else []),
            {
                "$lookup": {
                    "from": ORDERS,
                    "localField": "order_id",
                    "foreignField": "_id",
                    "as": "o",
                }
            },
            {"$unwind": "$o"},
            {
                "$project": {
                    "_id": 0,
                    # Date differences are milliseconds; a missing paid_at gives null.
                    "latency": {"$subtract": ["$captured_at", "$o.placed_at"]},
                    "round_trip": {"$subtract": ["$o.paid_at", "$o.placed_at"]},
                }
            },
        ]
        rows = await (await _database(tx)[PAYMENTS].aggregate(pipeline, session=tx)).to_list()
        return (
            [row["latency"] / 1000 for row in rows],
            [row["round_trip"] / 1000 for row in rows if row.get("round_trip") is not None],
        )
