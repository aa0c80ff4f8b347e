"""An inbox whose handler takes its time (``outboxkit inbox
tests.integration.inbox_slow_app:inbox``), for the tests of transactions that must fit the
database's time limit: an event of entity ``sleep:<seconds>:<name>`` waits that long (outside
the database) before its effect; others take effect at once. One ``effects`` row (document) per
handled event, as in :mod:`inbox_app`; ``TEST_BATCH_HANDLER=1`` makes it a batch handler."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from outboxkit.core.mongodb import database_name
from outboxkit.inbox import Inbox
from tests.integration.inbox_app import DATABASE_URL, ON_MONGODB, Payment

inbox: Inbox[Any] = Inbox(os.environ.get("TEST_INBOX_NAME", "slow"))


async def take_effect_slowly(event: Payment, tx: Any) -> None:
    await take_effects_slowly([event], tx)


async def take_effects_slowly(events: Sequence[Payment], tx: Any) -> None:
    for event in events:
        if event.entity.startswith("sleep:"):
            await asyncio.sleep(float(event.entity.split(":")[1]))
    if ON_MONGODB:
        effects = tx.client.get_database(database_name(DATABASE_URL)).effects
        rows = [{"event_id": e.id, "entity": e.entity, "seq": e.seq} for e in events]
        await effects.insert_many(rows, session=tx)
        return
    async with tx.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO effects (event_id, entity, seq) VALUES (%s, %s, %s)",
            [(e.id, e.entity, e.seq) for e in events],
        )


#: TEST_BATCH_HANDLER=1: a batch handler (a call of several slow events outlives the limit).
if os.environ.get("TEST_BATCH_HANDLER") == "1":
    inbox.batch_handler(Payment)(take_effects_slowly)
else:
    inbox.handler(Payment)(take_effect_slowly)
