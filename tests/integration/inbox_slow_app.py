"""An inbox whose handler takes its time (``outboxkit inbox
tests.integration.inbox_slow_app:inbox``), for the tests of transactions that must fit the
database's time limit: an event of entity ``sleep:<seconds>:<name>`` waits that long (outside
the database) before its effect; others take effect at once. One ``effects`` row (document) per
handled event, as in :mod:`inbox_app`."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from outboxkit.core.mongodb import database_name
from outboxkit.inbox import Inbox
from tests.integration.inbox_app import DATABASE_URL, ON_MONGODB, Payment

inbox: Inbox[Any] = Inbox(os.environ.get("TEST_INBOX_NAME", "slow"))


@inbox.handler(Payment)
async def take_effect_slowly(event: Payment, tx: Any) -> None:
    if event.entity.startswith("sleep:"):
        await asyncio.sleep(float(event.entity.split(":")[1]))
    if ON_MONGODB:
        effects = tx.client.get_database(database_name(DATABASE_URL)).effects
        await effects.insert_one(
            {"event_id": event.id, "entity": event.entity, "seq": event.seq}, session=tx
        )
        return
    await tx.execute(
        "INSERT INTO effects (event_id, entity, seq) VALUES (%s, %s, %s)",
        (event.id, event.entity, event.seq),
    )
