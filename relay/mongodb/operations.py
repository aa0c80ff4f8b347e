"""MongoDB implementation of :class:`~outboxkit.relay.storage.OutboxOperations`: the operator's
repairs (``outboxkit outbox failed|retry|skip|replay``), on a client of their own.

Each keeps per-key order (G2): a retried record keeps its position (it held back its key, so it
is still the key's oldest), and a replayed one is a copy with a new position taken as a writer
takes one (:mod:`.positions`), after everything already pending of its key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime
from typing import TypeVar
from uuid import UUID

from pymongo.asynchronous.client_session import AsyncClientSession

from outboxkit.core import mongodb
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.mongodb.positions import take_positions
from outboxkit.relay.records import RecordInfo, RecordState

T = TypeVar("T")

#: Fields of a published record that its replayed copy does not take.
_PUBLISHED_ONLY = {"_id", "published_at", "expires_at", "last_error", "attempts"}


class MongoOutboxOperations(mongodb.MongoConnection):
    """Use as ``async with MongoOutboxOperations(url) as operations:``."""

    def __init__(
        self, url: str, *, connect_timeout: float = 10.0, app_name: str = "outboxkit-cli"
    ) -> None:
        super().__init__(url, connect_timeout=connect_timeout, app_name=app_name)
        self._outbox = mongodb.collection(
            self.database,
            "outbox",
            read_concern=mongodb.MAJORITY_READ,
            write_concern=mongodb.MAJORITY_WRITE,
        )
        self._keys = mongodb.collection(self.database, "keys")

    async def list_records(self, state: RecordState, limit: int) -> list[RecordInfo]:
        cursor = self._outbox.find({"state": state}).sort("_id", 1).limit(limit)
        return [_info(doc) for doc in await _guard(cursor.to_list())]

    async def retry_failed(self, event_ids: Sequence[UUID]) -> int:
        # The record keeps its position: it held back its key, so it is still the key's oldest.
        result = await _guard(
            self._outbox.update_many(
                {"state": "failed", "event_id": {"$in": list(event_ids)}},
                {"$set": {"state": "pending", "attempts": 0}, "$unset": {"last_error": ""}},
            )
        )
        return int(result.modified_count)

    async def skip_failed(self, event_ids: Sequence[UUID]) -> int:
        result = await _guard(
            self._outbox.delete_many({"state": "failed", "event_id": {"$in": list(event_ids)}})
        )
        return int(result.deleted_count)

    async def replay(self, event_ids: Sequence[UUID]) -> int:
        """Copies with new positions: published after everything already pending of their key,
        never ahead of newer events. The event id stays, so inboxes that saw it absorb it."""

        async def copy(session: AsyncClientSession) -> int:
            kept = self._outbox.find(
                {"state": "published", "event_id": {"$in": list(event_ids)}}, session=session
            ).sort([("position", 1), ("_id", 1)])
            copies = []
            now = datetime.now(UTC)
            async for doc in kept:
                key = (doc["topic"], bytes(doc["key"]))
                span = (await take_positions(self._keys, session, {key: 1}))[key]
                copy = {k: v for k, v in doc.items() if k not in _PUBLISHED_ONLY}
                fresh = {
                    "position": span.first,
                    "previous": span.previous,
                    "created_at": now,
                    "state": "pending",
                }
                copies.append({**copy, **fresh, "attempts": 0})
            if copies:
                await self._outbox.insert_many(copies, session=session)
            return len(copies)

        return await mongodb.in_transaction(self._client, copy, unavailable=StorageUnavailableError)


async def _guard(operation: Awaitable[T]) -> T:
    """A server or network failure surfaces as the relay's retriable error."""
    return await mongodb.guarded(operation, StorageUnavailableError)


def _info(doc: mongodb.Document) -> RecordInfo:
    return RecordInfo(
        event_id=doc["event_id"],
        event_type=doc["event_type"],
        topic=doc["topic"],
        partition=doc["partition"],
        key=bytes(doc["key"]),
        state=doc["state"],
        attempts=doc["attempts"],
        created_at=doc["created_at"],
        last_error=doc.get("last_error"),
        published_at=doc.get("published_at"),
    )
