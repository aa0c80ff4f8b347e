"""outboxkit's own PostgreSQL pools (core/postgres.py): they skip the check before using a
connection that ran a statement moments ago (a round trip on the relay's hot path), never hand
out one that sat idle and died meanwhile (a server restart), drop every idle connection once one
is found dead, and are back at full speed as soon as the server answers again after an outage —
not when psycopg_pool's own backoff next tries."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from outboxkit.core import postgres as pg
from outboxkit.embedded.postgres import EmbeddedPostgres
from outboxkit.relay import PostgresOutboxStorage
from outboxkit.relay.exceptions import StorageUnavailableError
from tests.helpers import holds_for, wait_for


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


async def test_one_dead_connection_found_drops_its_idle_siblings_at_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every idle connection of the pool died (a server restart): the first found dead makes
    the others suspect, so the next connection is a new one. Before, psycopg_pool lent and
    checked the dead ones in turn, 0, 1, 2 s apart: 3 s for the fourth."""
    monkeypatch.setattr(pg, "CHECK_AFTER_IDLE", 0.0)
    pool = pg.RecoveringPool(pg_url, size=4, connect_timeout=10, name="test")
    await pool.open()
    try:
        async with contextlib.AsyncExitStack() as lent:
            conns = [await lent.enter_async_context(pool.connection()) for _ in range(4)]
            pids = [conn.info.backend_pid for conn in conns]
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [pids]
            )
        began = time.monotonic()
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
            assert conn.info.backend_pid not in pids
        assert time.monotonic() - began < 1.0
    finally:
        await pool.close()


async def test_after_an_outage_the_first_connection_comes_as_the_server_answers(
    pg_factory: Callable[[], EmbeddedPostgres],
) -> None:
    """A server down for 4 s while a client keeps asking (as a worker retries): the pool says
    the database does not answer, and once it does, a connection comes within a probe's
    interval. Before, psycopg_pool tried to reconnect 1, 2, 4 s apart: the server back after
    4.5 s was not tried before 7 s."""
    server = await asyncio.to_thread(pg_factory)
    pool = pg.RecoveringPool(server.url(), size=2, connect_timeout=2, name="test")
    await pool.open()

    async def statement() -> bool:
        try:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
                return True
        except (psycopg.OperationalError, PoolTimeout):
            return False

    try:
        assert await statement()
        await asyncio.to_thread(server.stop, "immediate")

        async def refused() -> None:
            assert not await statement()

        await holds_for(4.0, refused, interval=0.1)
        assert pool.unanswered_for() is not None
        await asyncio.to_thread(server.start)
        answers = time.monotonic()
        await wait_for(statement, within=10, interval=0.01, what="a statement after the outage")
        assert time.monotonic() - answers < 1.0
        assert pool.unanswered_for() is None
        assert pool.renewals == 1
    finally:
        await pool.close()
