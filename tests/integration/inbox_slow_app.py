"""An inbox whose handler takes its time (``outboxkit inbox
tests.integration.inbox_slow_app:inbox``), for the tests of transactions that must fit the
database's time limit: an event of entity ``sleep:<seconds>:<name>`` waits that long (outside
the database) before its effect; others take effect at once. Its effects are :mod:`inbox_app`'s
(one ``effects`` row or document per handled event); ``TEST_BATCH_HANDLER=1`` makes it a batch
handler."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from outboxkit.inbox import Inbox
from tests.integration.inbox_app import Payment, take_effects

inbox: Inbox[Any] = Inbox(os.environ.get("TEST_INBOX_NAME", "slow"))


async def take_effect_slowly(event: Payment, tx: Any) -> None:
    await take_effects_slowly([event], tx)


async def take_effects_slowly(events: Sequence[Payment], tx: Any) -> None:
    for event in events:
        if event.entity.startswith("sleep:"):
            await asyncio.sleep(float(event.entity.split(":")[1]))
    await take_effects(events, tx)


#: TEST_BATCH_HANDLER=1: a batch handler (a call of several slow events outlives the limit).
if os.environ.get("TEST_BATCH_HANDLER") == "1":
    inbox.batch_handler(Payment)(take_effects_slowly)
else:
    inbox.handler(Payment)(take_effect_slowly)
