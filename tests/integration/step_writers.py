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

from outboxkit.core.mongodb import database_name, is_unavailable
from outboxkit.core.settings import ConnectionSettings, database_kind
from outboxkit.relay import PostgresOutbox, StorageUnavailableError
from outboxkit.schemas import Event
from outboxkit.service import Outboxkit


class DatabaseAwayError(Exception):
    """The connection failed: the last commit may or may not have happened."""


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
                except (
                    psycopg.errors.UniqueViolation,
                    psycopg.errors.DuplicateTable,
                    psycopg.errors.DuplicateObject,  # the table's row type, created with it
                ):
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
    """Writes through the product's own :meth:`Outboxkit.run_transaction`, which retries a
    transaction the database aborted (a write conflict, a primary that stepped down) and retries
    only the commit when its outcome is unknown. Besides the ``steps`` row, each transaction
    increments its key's count in ``step_counts``: an effect that a transaction retried after it
    had committed would apply twice (:func:`business_counts`)."""

    def __init__(self, url: str) -> None:
        self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            url, uuidRepresentation="standard", serverSelectionTimeoutMS=2000
        )
        self.db = self.client.get_database(database_name(url))
        self.kit: Outboxkit[AsyncClientSession] = Outboxkit(
            source="urn:test", settings=ConnectionSettings(database_url=url, connect_timeout=2)
        )
        self._open = False

    async def write(self, event: Event) -> None:
        async def work(session: AsyncClientSession) -> None:
            db = session.client.get_database(self.db.name)
            await db.steps.insert_one({"_id": event.id}, session=session)
            counted = {"$inc": {"n": 1}}
            await db.step_counts.update_one(
                {"_id": event.key}, counted, upsert=True, session=session
            )
            await self.kit.add(session, event)

        try:
            if not self._open:
                await self.kit.__aenter__()
                self._open = True
            await self.kit.run_transaction(work)
        except (StorageUnavailableError, PyMongoError) as exc:
            if isinstance(exc, PyMongoError) and not is_unavailable(exc):
                raise
            raise DatabaseAwayError from exc

    async def committed(self, event_id: UUID) -> bool | None:
        try:
            return await self.db.steps.find_one({"_id": event_id}) is not None
        except PyMongoError:
            return None

    async def close(self) -> None:
        if self._open:
            self._open = False
            await self.kit.__aexit__(None, None, None)
        await self.client.close()


async def business_counts(url: str) -> dict[str, int]:
    """Key → how many times MongoStepWriter's business effect applied to it."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client.get_database(database_name(url))
        return {str(doc["_id"]): int(doc["n"]) async for doc in db.step_counts.find()}
    finally:
        await client.close()
