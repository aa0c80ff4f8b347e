"""The inboxes that bench/inbox.py runs: a handler that inserts one row (PostgreSQL,
``outboxkit inbox bench.inbox_app:inbox``) or one document (MongoDB,
``bench.inbox_app:mongo_inbox``) per event, in the transaction the inbox gives it; the same
inboxes with a handler that writes nothing (``inbox_noop``, ``mongo_inbox_noop``), and with a
batch handler that inserts a run of events' rows or documents in one command (``inbox_batch``,
``mongo_inbox_batch``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import psycopg
from pymongo.asynchronous.client_session import AsyncClientSession

from outboxkit.inbox import Inbox
from outboxkit.schemas import Event


class Paid(Event, type="bench.paid", key_field="account"):
    account: str
    amount: int


NAME = os.environ.get("BENCH_INBOX_NAME", "bench")

inbox = Inbox(NAME)
mongo_inbox = Inbox[AsyncClientSession](NAME)
#: Handlers that write nothing: what the inbox itself costs (bench/inbox.py --handlers noop).
inbox_noop = Inbox(NAME)
mongo_inbox_noop = Inbox[AsyncClientSession](NAME)
#: Batch handlers: one command for a run of events (bench/inbox.py --handlers batch).
inbox_batch = Inbox(NAME)
mongo_inbox_batch = Inbox[AsyncClientSession](NAME)


@inbox.handler(Paid)
async def record(event: Paid, tx: psycopg.AsyncConnection[Any]) -> None:
    await tx.execute("INSERT INTO payments VALUES (%s, %s)", (event.id, event.amount))


@mongo_inbox.handler(Paid)
async def record_document(event: Paid, tx: AsyncClientSession) -> None:
    # The database named by OUTBOXKIT_DATABASE_URL's path, the inbox's own.
    payments = tx.client.get_default_database().get_collection("payments")
    await payments.insert_one({"event_id": event.id, "amount": event.amount}, session=tx)


@inbox_noop.handler(Paid)
@mongo_inbox_noop.handler(Paid)
async def nothing(event: Paid, tx: object) -> None:
    pass


@inbox_batch.batch_handler(Paid)
async def record_all(events: Sequence[Paid], tx: psycopg.AsyncConnection[Any]) -> None:
    async with tx.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO payments VALUES (%s, %s)", [(e.id, e.amount) for e in events]
        )


@mongo_inbox_batch.batch_handler(Paid)
async def record_documents(events: Sequence[Paid], tx: AsyncClientSession) -> None:
    payments = tx.client.get_default_database().get_collection("payments")
    await payments.insert_many([{"event_id": e.id, "amount": e.amount} for e in events], session=tx)
