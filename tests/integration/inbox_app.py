"""The inbox the inbox tests run (``outboxkit inbox tests.integration.inbox_app:inbox``), on
PostgreSQL or MongoDB (whichever OUTBOXKIT_DATABASE_URL names).

Its handler writes one ``effects`` row (document) per handled event, with no unique constraint:
a second effect of one event would show up as a second row.

``python -m tests.integration.inbox_app`` runs the same worker as ``outboxkit inbox`` with its
store wrapped in :class:`CrashAfterCommit`: the crash guarantee G6 is about is injected from
here, never by a hook in the product."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from bson import ObjectId
from pydantic import Field
from pymongo import UpdateOne

from outboxkit.backends import backend_for
from outboxkit.core.logs import configure_logging
from outboxkit.core.mongodb import database_name
from outboxkit.core.settings import load_settings
from outboxkit.inbox import BatchOutcome, Delivery, Inbox, InboxSettings, InboxStore, InboxWorker
from outboxkit.relay import MongoOutbox, PostgresOutbox
from outboxkit.schemas import Event

#: Each test names its own inbox (and so its own consumer group and dedupe key). Its handlers
#: take the transaction of either database.
inbox: Inbox[Any] = Inbox(os.environ.get("TEST_INBOX_NAME", "tests"))

DATABASE_URL = os.environ.get("OUTBOXKIT_DATABASE_URL", "postgresql://")
ON_MONGODB = DATABASE_URL.startswith("mongodb")

#: The entity whose events the handler refuses (a bug a test "fixes" by restarting without it).
FAILING_ENTITY = os.environ.get("TEST_FAILING_ENTITY", "always-fails")
#: The entity whose events the handler never finishes (a hung dependency).
HANGING_ENTITY = "hangs"

#: ``at``: when the handler ran (the failover tests measure the inbox's delay with it).
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS effects "
    "(event_id uuid, entity text, seq int, at timestamptz DEFAULT clock_timestamp())"
)


class Payment(Event, type="test.payment", key_field="entity"):
    entity: str
    seq: int
    amount: int = Field(default=1, ge=0)


async def take_effect(event: Payment, tx: Any) -> None:
    await take_effects([event], tx)


async def take_effects(events: Sequence[Payment], tx: Any) -> None:
    """One command for all of ``events``: the way a batch handler writes."""
    for event in events:
        if event.entity == FAILING_ENTITY:
            raise RuntimeError(f"handler cannot process {event.entity}")
        if event.entity == HANGING_ENTITY:
            await asyncio.Event().wait()
    if ON_MONGODB:
        effects = tx.client.get_database(database_name(DATABASE_URL)).effects
        # ``at`` from the server's clock ($$NOW), as PostgreSQL's clock_timestamp(): a worker on
        # a skewed clock (tests/integration/test_clock_skew.py) must not skew the inbox's delays.
        rows = [
            UpdateOne(
                {"_id": ObjectId()},
                [
                    {"$set": {"event_id": e.id, "entity": {"$literal": e.entity}, "seq": e.seq}},
                    {"$set": {"at": "$$NOW"}},
                ],
                upsert=True,
            )
            for e in events
        ]
        await effects.bulk_write(rows, session=tx)
        return
    async with tx.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO effects (event_id, entity, seq) VALUES (%s, %s, %s)",
            [(e.id, e.entity, e.seq) for e in events],
        )


#: TEST_BATCH_HANDLER=1: Payment's handler is a batch handler (Inbox.batch_handler).
if os.environ.get("TEST_BATCH_HANDLER") == "1":
    inbox.batch_handler(Payment)(take_effects)
else:
    inbox.handler(Payment)(take_effect)


class Refund(Event, type="test.refund", key_field="entity"):
    entity: str
    seq: int


class RefundIssued(Event, type="test.refund_issued", topic="refunds-issued", key_field="entity"):
    entity: str
    seq: int


outbox: PostgresOutbox | MongoOutbox = (
    MongoOutbox(source="urn:test:inbox", database=database_name(DATABASE_URL))
    if ON_MONGODB
    else PostgresOutbox(source="urn:test:inbox")
)


@inbox.handler(Refund)
async def issue_refund(event: Refund, tx: Any) -> None:
    """Chaining: the handler's effect is an outbox event, in the same transaction."""
    await outbox.add(tx, RefundIssued(entity=event.entity, seq=event.seq))


class CrashAfterCommit:
    """An inbox store that SIGKILLs its own process, with ``probability``, right after a
    database transaction that ran a handler committed — before the worker could commit the
    Kafka offset: the crash G6 is about.

    On MongoDB (``alone``), only when no other partition's transaction is open in this
    process: a MongoDB transaction left open by a killed process keeps its locks until mongod
    aborts it (``transactionLifetimeLimitSeconds``, 60 s), which would only stall the next
    worker. So once the crash is drawn, no new transaction starts, and the crash comes when the
    last open one has committed. (Waiting instead for a moment with nothing open, with both
    partitions busy, crashed as rarely as twice in 400 events.) PostgreSQL rolls an open
    transaction back when the connection drops, so there the crash comes at once."""

    def __init__(self, store: InboxStore[Any], probability: float, *, alone: bool) -> None:
        self._store = store
        self._probability = probability
        self._alone = alone
        self._open = 0
        self._armed = False

    async def process_batch(self, inbox: str, deliveries: Sequence[Delivery[Any]]) -> BatchOutcome:
        if self._armed:
            await asyncio.Event().wait()  # never starts: the process is about to die
        self._open += 1
        try:
            outcome = await self._store.process_batch(inbox, deliveries)
            drawn = any(outcome.ran) and random.random() < self._probability
            self._armed = self._armed or drawn
            return outcome
        finally:
            self._open -= 1
            if self._armed and not (self._alone and self._open):
                os.kill(os.getpid(), signal.SIGKILL)

    async def purge(self, older_than: timedelta, limit: int) -> int:
        return await self._store.purge(older_than, limit)

    async def count(self, inbox: str) -> int:
        return await self._store.count(inbox)

    async def ping(self) -> None:
        await self._store.ping()

    def unanswered_for(self) -> float | None:
        return self._store.unanswered_for()


async def _run_crashing(probability: float) -> None:
    settings = load_settings(InboxSettings)
    backend = backend_for(settings.database_url)
    async with backend.inbox_store(settings) as store:
        crashing = CrashAfterCommit(store, probability, alone=backend.kind == "mongodb")
        worker = InboxWorker(inbox, settings, crashing)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()


if __name__ == "__main__":
    configure_logging("console")
    asyncio.run(_run_crashing(float(os.environ["TEST_CRASH_AFTER_COMMIT"])))
