"""outboxkit's own PostgreSQL pools skip the check before using a connection that ran a
statement moments ago (a round trip on the relay's hot path), and still never hand out one that
sat idle and died meanwhile (a server restart)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from outboxkit.core import pg
from outboxkit.relay import PostgresOutboxStorage
from outboxkit.relay.exceptions import StorageUnavailableError


async def _kill_pooled_connection(url: str, storage: PostgresOutboxStorage) -> None:
    async with storage._connection() as conn:
        pid = conn.info.backend_pid
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_connection_idle_longer_than_the_bound_is_checked_and_replaced(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "CHECK_AFTER_IDLE", 0.2)
    async with PostgresOutboxStorage(pg_url, pool_size=1) as storage:
        await _kill_pooled_connection(pg_url, storage)
        await asyncio.sleep(0.3)
        assert await storage.backlog() == []  # the check found it dead: a new connection


async def test_a_connection_used_moments_ago_is_not_checked_and_its_failure_is_retriable(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "CHECK_AFTER_IDLE", 60.0)
    async with PostgresOutboxStorage(pg_url, pool_size=1) as storage:
        await _kill_pooled_connection(pg_url, storage)
        with pytest.raises(StorageUnavailableError):
            await storage.backlog()  # no check: the statement meets the dead connection
        assert await storage.backlog() == []  # the pool replaced it
