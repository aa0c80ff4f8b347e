"""The inbox the inbox tests run (``outboxkit inbox tests.integration.inbox_app:inbox``), on
PostgreSQL or MongoDB (whichever OUTBOXKIT_DATABASE_URL names).

Its handler writes one ``effects`` row (document) per handled event, with no unique constraint:
a second effect of one event would show up as a second row."""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field

from outboxkit.core.mongo import database_name
from outboxkit.inbox import Inbox
from outboxkit.relay import MongoOutbox, PostgresOutbox
from outboxkit.schemas import Event

#: Each test names its own inbox (and so its own consumer group and dedupe key). Its handlers
#: take the transaction of either database.
inbox: Inbox[Any] = Inbox(os.environ.get("TEST_INBOX_NAME", "tests"))

DATABASE_URL = os.environ.get("OUTBOXKIT_DATABASE_URL", "postgresql://")
ON_MONGODB = DATABASE_URL.startswith("mongodb")

#: The entity whose events the handler refuses (a bug a test "fixes" by restarting without it).
FAILING_ENTITY = os.environ.get("TEST_FAILING_ENTITY", "always-fails")

EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS effects (event_id uuid, entity text, seq int)"


class Payment(Event, type="test.payment", key_field="entity"):
    entity: str
    seq: int
    amount: int = Field(default=1, ge=0)


@inbox.handler(Payment)
async def take_effect(event: Payment, tx: Any) -> None:
    if event.entity == FAILING_ENTITY:
        raise RuntimeError(f"handler cannot process {event.entity}")
    if ON_MONGODB:
        effects = tx.client.get_database(database_name(DATABASE_URL)).effects
        row = {"event_id": event.id, "entity": event.entity, "seq": event.seq}
        await effects.insert_one(row, session=tx)
        return
    await tx.execute(
        "INSERT INTO effects (event_id, entity, seq) VALUES (%s, %s, %s)",
        (event.id, event.entity, event.seq),
    )


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
