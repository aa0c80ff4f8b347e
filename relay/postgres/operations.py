"""PostgreSQL implementation of :class:`~outboxkit.relay.storage.OutboxOperations`: the
operator's repairs (``outboxkit outbox failed|retry|skip|replay``), on a pool of their own; the
statements are in ``operations.sql``."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from outboxkit.core.sql import load_queries
from outboxkit.relay.postgres.statements import NamedStatements
from outboxkit.relay.records import RecordInfo, RecordState


class PostgresOutboxOperations(NamedStatements):
    """Use as ``async with PostgresOutboxOperations(url) as operations:``."""

    queries = load_queries("outboxkit.relay.postgres", "operations.sql")

    def __init__(self, url: str, *, connect_timeout: float = 10.0) -> None:
        super().__init__(url, pool_size=1, connect_timeout=connect_timeout, name="outboxkit-cli")

    async def list_records(self, state: RecordState, limit: int) -> list[RecordInfo]:
        rows = await self._fetch("list_records", {"state": state, "limit": limit})
        return [
            RecordInfo(eid, etype, topic, partition, bytes(key), st, attempts, at, error, sent)
            for eid, etype, topic, partition, key, st, attempts, at, error, sent in rows
        ]

    async def retry_failed(self, event_ids: Sequence[UUID]) -> int:
        return await self._execute("retry_failed", {"event_ids": list(event_ids)})

    async def skip_failed(self, event_ids: Sequence[UUID]) -> int:
        return await self._execute("skip_failed", {"event_ids": list(event_ids)})

    async def replay(self, event_ids: Sequence[UUID]) -> int:
        return await self._execute("replay", {"event_ids": list(event_ids)})
