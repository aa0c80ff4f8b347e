"""The inbox that bench/inbox.py runs (``outboxkit inbox bench.inbox_app:inbox``): a handler
that inserts one row per event."""

from __future__ import annotations

import os
from typing import Any

import psycopg

from outboxkit.inbox import Inbox
from outboxkit.schemas import Event


class Paid(Event, type="bench.paid", key_field="account"):
    account: str
    amount: int


inbox = Inbox(os.environ.get("BENCH_INBOX_NAME", "bench"))


@inbox.handler(Paid)
async def record(event: Paid, tx: psycopg.AsyncConnection[Any]) -> None:
    await tx.execute("INSERT INTO payments VALUES (%s, %s)", (event.id, event.amount))
