"""The migration runners against real PostgreSQL and MongoDB servers."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from pymongo import AsyncMongoClient

from outboxkit.core.mongodb import database_name
from outboxkit.migrations import load_migrations
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.mongodb import pending_migrations as pending_mongodb_migrations
from outboxkit.migrations.postgres import (
    applied_versions,
    migrate,
    pending_migrations,
    script,
)
from tests.helpers import run_cli
from tests.integration.conftest import with_dbname


async def _schema(url: str) -> list[tuple[object, ...]]:
    """Tables, columns and indexes of schema outboxkit (applied_at values excluded)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            """
            SELECT table_name, column_name, data_type, is_nullable, column_default
            FROM information_schema.columns WHERE table_schema = 'outboxkit'
            UNION ALL
            SELECT tablename, indexname, indexdef, '', '' FROM pg_indexes
            WHERE schemaname = 'outboxkit'
            ORDER BY 1, 2
            """
        )
        return await cur.fetchall()


async def test_migrate_from_empty_then_again_is_a_no_op(empty_pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_pg_url, autocommit=True) as conn:
        assert await pending_migrations(conn) == load_migrations()
        applied = await migrate(conn)
        assert applied == load_migrations()
        assert await migrate(conn) == []
        assert set(await applied_versions(conn)) == {m.version for m in load_migrations()}


async def test_concurrent_migrations_apply_each_migration_once(empty_pg_url: str) -> None:
    async def run() -> list[int]:
        async with await psycopg.AsyncConnection.connect(empty_pg_url, autocommit=True) as conn:
            return [m.version for m in await migrate(conn)]

    results = await asyncio.gather(*(run() for _ in range(4)))
    assert sorted(v for r in results for v in r) == [m.version for m in load_migrations()]


async def test_sql_script_gives_the_same_schema_as_the_runner(
    pg_url: str, empty_pg_url: str
) -> None:
    """Users who apply `outboxkit migrate --sql` with their own tool get the same schema, and
    outboxkit sees it as fully migrated."""
    async with await psycopg.AsyncConnection.connect(empty_pg_url, autocommit=True) as conn:
        await conn.execute(script(load_migrations()).encode())
        assert await pending_migrations(conn) == []
    assert await _schema(empty_pg_url) == await _schema(pg_url)


def test_cli_migrate_and_sql(empty_pg_url: str) -> None:
    printed = run_cli("migrate", "--sql").stdout
    assert "CREATE TABLE outboxkit.schema_migrations" in printed
    first = run_cli("migrate", "--database-url", empty_pg_url)
    assert first.stdout.startswith("applied 0001_init")
    again = run_cli("migrate", "--database-url", empty_pg_url)
    assert again.stdout.strip() == "schema is up to date"


def test_cli_migrate_unreachable_database_fails_cleanly(pg_server_url: str) -> None:
    url = with_dbname(pg_server_url, "no_such_database")
    result = run_cli("migrate", "--database-url", url)
    assert result.returncode == 1
    assert "no_such_database" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("url", ["mysql://localhost/db", "not a url"])
def test_cli_migrate_rejects_bad_urls(url: str) -> None:
    result = run_cli("migrate", "--database-url", url)
    assert result.returncode == 2
    assert "OUTBOXKIT_DATABASE_URL" in result.stderr


async def test_mongodb_migrate_then_again_is_a_no_op_and_check_agrees(
    mongo_url: str, kafka_bootstrap: str
) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": mongo_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "",
    }
    check = run_cli("check", env=env)
    assert check.returncode == 1
    assert "migration(s) not applied: 0001_init, 0002_head_index" in check.stdout
    # A new database: migrations pending, no relay that could mind them.
    fresh = run_cli("migrate", "--check", env=env)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert fresh.stdout.strip().endswith(
        "ok: no relay is running; `outboxkit migrate` may apply them"
    )
    first = run_cli("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "applied 0001_init, 0002_head_index"
    assert run_cli("migrate", env=env).stdout.strip() == "schema is up to date"
    check = run_cli("check", env=env)
    assert check.returncode == 0, check.stdout
    assert "schema is up to date" in check.stdout


async def test_mongodb_concurrent_migrations_both_succeed(mongo_url: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = client.get_database(database_name(mongo_url))
    try:
        results = await asyncio.gather(migrate_mongodb(db), migrate_mongodb(db))
        assert sorted(m.version for r in results for m in r) == [1, 2]  # each applied once
        indexes = await db.get_collection("outboxkit.outbox").index_information()
        assert {"outbox_head_idx", "outbox_failed_idx", "outbox_expires_ttl"} <= set(indexes)
        assert "outbox_pending_idx" not in indexes  # replaced by outbox_head_idx (0002)
        assert await pending_mongodb_migrations(db) == []
    finally:
        await client.close()
