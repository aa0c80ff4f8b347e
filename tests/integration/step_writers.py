"""A service's writes, per database: one business row and one outbox event per transaction.

The guarantee tests write through these while they kill and restart servers, so each writer
must know, after a connection failure, whether its last commit happened: it asks for the
business row (``steps``), which commits with the event or not at all.
"""

from __future__ import annotations

from typing import Any, Protocol
from uuid import UUID

import psycopg
from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import PyMongoError

from outboxkit.core.exceptions import OutboxkitError
from outboxkit.core.mongo import database_name, in_transaction, is_unavailable
from outboxkit.core.settings import database_kind
from outboxkit.relay import MongoOutbox, PostgresOutbox
from outboxkit.schemas import Event


class DatabaseAwayError(Exception):
    """The connection failed: the last commit may or may not have happened."""


class _Away(OutboxkitError):
    """MongoDB is away (in_transaction's retriable error)."""


class StepWriter(Protocol):
    async def write(self, event: Event) -> None:
        """Commit the event's business row and the event, or raise DatabaseAwayError."""

    async def committed(self, event_id: UUID) -> bool | None:
        """Whether the event's transaction committed; None while the database is away."""

    async def close(self) -> None: ...


def step_writer(url: str) -> StepWriter:
    return PostgresStepWriter(url) if database_kind(url) == "postgresql" else MongoStepWriter(url)


class PostgresStepWriter:
    def __init__(self, url: str) -> None:
        self.url = url
        self.outbox = PostgresOutbox(source="urn:test")
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def write(self, event: Event) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=2)
                try:
                    await self._conn.execute(
                        "CREATE TABLE IF NOT EXISTS steps (event_id uuid PRIMARY KEY)"
                    )
                    await self._conn.commit()
                except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                    await self._conn.rollback()  # another writer created it at the same time
            async with self._conn.transaction():
                await self._conn.execute("INSERT INTO steps VALUES (%s)", (event.id,))
                await self.outbox.add(self._conn, event)
        except psycopg.OperationalError as exc:
            # Close the broken session: it may be left mid-pipeline, and an unclosed connection
            # fails the test run later.
            await self.close()
            raise DatabaseAwayError from exc

    async def committed(self, event_id: UUID) -> bool | None:
        try:
            async with await psycopg.AsyncConnection.connect(self.url, connect_timeout=2) as c:
                cur = await c.execute("SELECT 1 FROM steps WHERE event_id = %s", (event_id,))
                return await cur.fetchone() is not None
        except psycopg.OperationalError:
            return None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


class MongoStepWriter:
    def __init__(self, url: str) -> None:
        self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            url, uuidRepresentation="standard", serverSelectionTimeoutMS=2000
        )
        self.db = self.client.get_database(database_name(url))
        self.outbox = MongoOutbox(source="urn:test", database=self.db.name)

    async def write(self, event: Event) -> None:
        async def work(session: AsyncClientSession) -> None:
            await self.db.steps.insert_one({"_id": event.id}, session=session)
            await self.outbox.add(session, event)

        try:
            await in_transaction(self.client, work, unavailable=_Away)
        except (_Away, PyMongoError) as exc:
            if isinstance(exc, PyMongoError) and not is_unavailable(exc):
                raise
            raise DatabaseAwayError from exc

    async def committed(self, event_id: UUID) -> bool | None:
        try:
            return await self.db.steps.find_one({"_id": event_id}) is not None
        except PyMongoError:
            return None

    async def close(self) -> None:
        await self.client.close()
