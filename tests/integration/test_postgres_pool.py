"""outboxkit's own PostgreSQL pools skip the check before using a connection that ran a
statement moments ago (a round trip on the relay's hot path), and still never hand out one that
sat idle and died meanwhile (a server restart)."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit.core import postgres as pg
from outboxkit.relay import PostgresOutboxStorage
from outboxkit.relay.exceptions import StorageUnavailableError


@pytest.mark.parametrize(
    ("check_after_idle", "checked"),
    [(0.0, True), (60.0, False)],
    ids=["idle-past-the-bound", "used-moments-ago"],
)
async def test_a_dead_pooled_connection_is_replaced_by_the_check_or_after_its_failure(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, check_after_idle: float, checked: bool
) -> None:
    """Idle past the bound (0 s: every use): the check finds the connection dead and the pool
    hands out a new one. Used moments ago: no check, the statement meets the dead connection and
    fails as a retriable error, and the pool replaces it."""
    monkeypatch.setattr(pg, "CHECK_AFTER_IDLE", check_after_idle)
    async with PostgresOutboxStorage(pg_url, pool_size=1) as storage:
        async with storage._connection() as conn:
            pid = conn.info.backend_pid
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        if not checked:
            with pytest.raises(StorageUnavailableError):
                await storage.backlog()
        assert await storage.backlog() == []
