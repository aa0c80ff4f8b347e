"""mypy catches a handler or a store written for the other database (issue: "typed so mypy
--strict catches a handler written for the wrong backend")."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

SNIPPET = textwrap.dedent(
    """
    from typing import Any

    import psycopg
    from pymongo.asynchronous.client_session import AsyncClientSession

    from outboxkit.inbox import Inbox, InboxSettings, InboxWorker, MongoInboxStore
    from outboxkit.inbox import PostgresInboxStore
    from outboxkit.schemas import Event


    class Paid(Event, type="t.paid", topic="t", key_field="order"):
        order: str


    mongo_inbox = Inbox[AsyncClientSession]("payments")
    pg_inbox = Inbox("payments")  # PostgreSQL is the default


    async def on_mongo(event: Paid, tx: AsyncClientSession) -> None: ...
    async def on_pg(event: Paid, tx: psycopg.AsyncConnection[Any]) -> None: ...


    mongo_inbox.handler(Paid)(on_mongo)
    pg_inbox.handler(Paid)(on_pg)
    mongo_inbox.handler(Paid)(on_pg)  # WRONG-HANDLER
    settings = InboxSettings(database_url="postgresql://h/db", topics=["t"])
    InboxWorker(pg_inbox, settings, PostgresInboxStore("postgresql://h/db"))
    InboxWorker(mongo_inbox, settings, MongoInboxStore("mongodb://h/db"))
    InboxWorker(mongo_inbox, settings, PostgresInboxStore("postgresql://h/db"))  # WRONG-STORE
    """
)


def test_mypy_rejects_a_handler_or_store_of_the_other_database(tmp_path: Path) -> None:
    source = tmp_path / "service.py"
    source.write_text(SNIPPET)
    out, err, status = api.run(["--strict", "--no-error-summary", str(source)])
    assert status == 1, out + err
    lines = SNIPPET.splitlines()
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    expected = {i + 1 for i, line in enumerate(lines) if "# WRONG-" in line}
    assert flagged == expected, out
