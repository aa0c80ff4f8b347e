"""The demo's shop on MongoDB: collections ``demo.orders`` and ``demo.payments`` beside outboxkit's
(``outboxkit.outbox``, …) in one database, so each service's writes and its events commit in one
multi-document transaction.

Times are the client's clock (one machine here): MongoDB has no server-side default for a field,
and its dates keep milliseconds, which is the resolution the demo's latencies are shown in.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bson.decimal128 import Decimal128
from pymongo.asynchronous.client_session import AsyncClientSession

from outboxkit.backends import Transactions
from outboxkit.core.mongodb import Database, MongoConnection
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


class MongoShop(MongoConnection):
    """:class:`~outboxkit.demo.shop.Shop` on MongoDB. ``transactions`` (from
    :func:`outboxkit.backends.backend_for`) write the orders with their events and retry
    MongoDB's transient conflicts; a client of its own creates the collections and reads them
    back. Use as ``async with MongoShop(url, transactions) as shop:``."""

    def __init__(self, url: str, transactions: Transactions) -> None:
        self._transactions = transactions
        super().__init__(url, connect_timeout=10.0, app_name="outboxkit-demo")
        self._name = self.database.name
        self._payments_outbox = MongoOutbox(source=PAYMENTS_SOURCE, database=self._name)
        # Handlers get the inbox's session; they find the shop's database through its client.
        self.payments_inbox = Inbox[AsyncClientSession](PAYMENTS_INBOX)
        self.payments_inbox.handler(OrderPlaced)(self.capture_payment)
        self.orders_inbox = Inbox[AsyncClientSession](ORDERS_INBOX)
        self.orders_inbox.handler(PaymentCaptured)(self.mark_paid)

    def _database(self, session: AsyncClientSession | None = None) -> Database:
        client = self._client if session is None else session.client
        return client.get_database(self._name)

    # -- the services ------------------------------------------------------------------------

    async def capture_payment(self, event: OrderPlaced, tx: AsyncClientSession) -> None:
        """The payments service, in the inbox's transaction: charge once, and say so (chaining)."""
        payment = payment_for(event)
        await self._database(tx)[PAYMENTS].insert_one(
            {
                "_id": payment.payment_id,
                "order_id": event.order_id,
                "amount": Decimal128(event.amount),
                "captured_at": datetime.now(UTC),
            },
            session=tx,
        )
        await self._payments_outbox.add(tx, payment)

    async def mark_paid(self, event: PaymentCaptured, tx: AsyncClientSession) -> None:
        """The orders service learns that its order was paid."""
        await self._database(tx)[ORDERS].update_one(
            {"_id": event.order_id}, {"$set": {"paid_at": datetime.now(UTC)}}, session=tx
        )

    async def place_order(self, order: OrderPlaced) -> None:
        async def work(session: AsyncClientSession) -> None:
            await self._database(session)[ORDERS].insert_one(
                {
                    "_id": order.order_id,
                    "customer_id": order.customer_id,
                    "amount": Decimal128(order.amount),
                    "placed_at": datetime.now(UTC),
                },
                session=session,
            )
            await self._transactions.outbox.add(session, order)

        # run(): a write conflict (two transactions on one key) is retried from the start.
        await self._transactions.run(work)

    # -- the demo's side ---------------------------------------------------------------------

    async def create(self) -> None:
        """The collections exist before the first transaction (creating one inside concurrent
        transactions conflicts); a payment's order is unique, as on PostgreSQL: a second charge
        for one order would fail loudly, not pass unnoticed."""
        db = self._database()
        await db.create_collection(ORDERS)
        payments = await db.create_collection(PAYMENTS)
        await payments.create_index("order_id", unique=True, name="payments_order_id")

    async def counts(self) -> ShopCounts:
        async with self._client.start_session(snapshot=True) as session:  # one snapshot
            db = self._database()
            return ShopCounts(
                orders=await db[ORDERS].count_documents({}, session=session),
                payments=await db[PAYMENTS].count_documents({}, session=session),
                paid=await db[ORDERS].count_documents(
                    {"paid_at": {"$exists": True}}, session=session
                ),
            )

    async def latencies(self, limit: int | None = None) -> tuple[list[float], list[float]]:
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
        cursor = await self._database()[PAYMENTS].aggregate(pipeline)
        rows = await cursor.to_list()
        return (
            [row["latency"] / 1000 for row in rows],
            [row["round_trip"] / 1000 for row in rows if row.get("round_trip") is not None],
        )

    async def is_paid(self, order: str) -> bool:
        found = await self._database()[ORDERS].find_one(
            {"_id": order, "paid_at": {"$exists": True}}, {"_id": 1}
        )
        return found is not None
