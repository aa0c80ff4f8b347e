"""Relays record their release with their presence, and ``outboxkit migrate --check`` compares
it with the pending migrations (docs/upgrading.md); a worker starts beside migrations of a newer
release unless one of them names a newer release it must run beside."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from typer.testing import CliRunner

import outboxkit.migrations.mongodb as mongodb_migrations
import outboxkit.migrations.postgres as postgres_migrations
from outboxkit._version import __version__
from outboxkit.cli import app
from outboxkit.core.mongodb import MongoConnection, collection
from outboxkit.migrations import Migration, MigrationError, load_migrations
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.mongodb import pending_migrations as pending_mongodb
from outboxkit.migrations.postgres import pending_migrations as pending_postgres
from outboxkit.relay.mongodb.presence import MongoPresence
from outboxkit.relay.postgres.presence import PostgresPresence, member_lock_key

GROUP = "outboxkit.relay.upgrade"


async def _check(url: str) -> tuple[int, str]:
    """``outboxkit migrate --check`` in this process (so that a test may patch the migrations
    it knows), on a thread: the command runs its own event loop."""

    def run() -> tuple[int, str]:
        result = CliRunner().invoke(app, ["migrate", "--check", "--database-url", url])
        return result.exit_code, result.output + repr(result.exception or "")

    return await asyncio.to_thread(run)


def _contract(kind: str, version: int) -> Migration:
    """A pending contract step that only a later release runs beside."""
    if kind == "postgresql":
        text = "-- contract: runs beside >= 99.0\nDROP TABLE outboxkit.relay_waiting;"
    else:
        text = (
            '[{"why": "-", "contract": "runs beside >= 99.0", '
            '"command": {"drop": "outboxkit.keys"}}]'
        )
    return Migration(version, "contract", text, kind)  # type: ignore[arg-type]


async def test_postgres_relays_versions_and_migrate_check(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    presence = PostgresPresence(pg_url, application_name="upgrade", connect_timeout=5)
    old_relay = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    try:
        await presence.announce(GROUP, "relay-new")
        # A relay of a release that recorded no version: its row, and its session's lock.
        key = member_lock_key(GROUP, "relay-old")
        await old_relay.execute("SELECT pg_advisory_lock(%s)", [key])
        await old_relay.execute(
            "INSERT INTO outboxkit.relay_members (group_id, member_id, lock_key) "
            "VALUES (%s, 'relay-old', %s)",
            [GROUP, key],
        )
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            cur = await conn.execute(
                "SELECT member_id, version FROM outboxkit.relay_members ORDER BY 1"
            )
            assert await cur.fetchall() == [("relay-new", __version__), ("relay-old", None)]

        code, output = await _check(pg_url)
        assert code == 0, output
        assert "schema is up to date" in output
        assert f"running relays: {__version__}: 1, unknown" in output
        # Not "can run beside the pending migrations": there are none.
        assert "ok: nothing to migrate\n" in output, output
        assert "pending" not in output, output

        # A pending contract step naming a release after every running relay's.
        contract = _contract("postgresql", len(load_migrations()) + 1)
        monkeypatch.setattr(
            postgres_migrations, "load_migrations", lambda: [*load_migrations(), contract]
        )
        code, output = await _check(pg_url)
        assert code == 1, output
        assert "runs beside outboxkit >= 99.0 only (contract)" in output
        assert f"FAIL {contract.label} runs beside outboxkit >= 99.0 only: 1 running" in output

        # A relay that died (its session ended) is not counted.
        await old_relay.close()
        monkeypatch.undo()
        code, output = await _check(pg_url)
        assert f"running relays: {__version__}: 1\n" in output, output
    finally:
        await presence.close()
        await old_relay.close()


async def test_postgres_worker_starts_beside_a_newer_release_s_expand_step(pg_url: str) -> None:
    newer = len(load_migrations()) + 1
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO outboxkit.schema_migrations (version, name, checksum) "
            "VALUES (%s, 'newer_expand', 'x')",
            [newer],
        )
        assert await pending_postgres(conn) == []
        await conn.execute(
            "INSERT INTO outboxkit.schema_migrations (version, name, checksum, runs_beside) "
            "VALUES (%s, 'newer_contract', 'x', '99.0')",
            [newer + 1],
        )
        with pytest.raises(MigrationError, match=r"upgrade outboxkit to 99\.0 or later"):
            await pending_postgres(conn)


@pytest.mark.mongodb
async def test_mongodb_relays_versions_and_migrate_check(
    mongo_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MongoConnection(mongo_url, connect_timeout=5, app_name="upgrade") as conn:
        await migrate_mongodb(conn.database)
        presence = MongoPresence(mongo_url, conn.database, app_name="upgrade", connect_timeout=5)
        try:
            await presence.announce(GROUP, "relay-new")
            record = await collection(conn.database, "relay_members").find_one()
            assert record is not None
            assert record["version"] == __version__

            code, output = await _check(mongo_url)
            assert code == 0, output
            assert f"running relays: {__version__}: 1" in output

            contract = _contract("mongodb", len(load_migrations("mongodb")) + 1)
            monkeypatch.setattr(
                mongodb_migrations,
                "load_migrations",
                lambda kind: [*load_migrations(kind), contract],
            )
            code, output = await _check(mongo_url)
            assert code == 1, output
            assert f"FAIL {contract.label} runs beside outboxkit >= 99.0 only" in output
            monkeypatch.undo()

            # A newer release's expand step: this one starts; its contract naming 99.0: not.
            migrations = collection(conn.database, "migrations")
            newer = len(load_migrations("mongodb")) + 1
            await migrations.insert_one({"_id": newer, "checksum": "x", "runs_beside": None})
            assert await pending_mongodb(conn.database) == []
            await migrations.insert_one({"_id": newer + 1, "checksum": "x", "runs_beside": "99.0"})
            with pytest.raises(MigrationError, match=r"upgrade outboxkit to 99\.0 or later"):
                await pending_mongodb(conn.database)
        finally:
            await presence.close()
