"""PostgreSQL migrations: each ``files/postgres/NNNN_name.sql`` file applied in its own
transaction, serialized across processes by an advisory lock, recorded in
``outboxkit.schema_migrations`` with the file's checksum.

Users who run their own migration tool (Alembic, Flyway, …) print the SQL with
``outboxkit migrate --sql`` (:func:`script`) and apply it there; the rows it inserts keep
``outboxkit check`` and ``outboxkit migrate`` in agreement with that tool.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from outboxkit.migrations import Migration, MigrationError, load_migrations, not_applied
from outboxkit.migrations.compat import runs_beside

#: Serializes concurrent `migrate` runs across processes (an arbitrary constant: "outboxkt").
_ADVISORY_LOCK_KEY = 0x6F7574626F786B74


def _record(m: Migration) -> tuple[str, list[object]]:
    """The INSERT that records ``m`` as applied, and its parameters. ``runs_beside`` is named
    only for a contract migration (the column exists from migration 0007 on, and every contract
    migration comes later)."""
    oldest = runs_beside(m)
    if oldest is None:
        return (
            "INSERT INTO outboxkit.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            [m.version, m.name, m.checksum],
        )
    return (
        "INSERT INTO outboxkit.schema_migrations (version, name, checksum, runs_beside) "
        "VALUES (%s, %s, %s, %s)",
        [m.version, m.name, m.checksum, oldest],
    )


def script(migrations: list[Migration]) -> str:
    """One SQL script that applies ``migrations`` and records them, for external tools."""
    parts = []
    for m in migrations:
        statement, values = _record(m)
        record = statement.replace("%s", "{}").format(*(_literal(v) for v in values)) + ";"
        parts.append(f"-- outboxkit migration {m.label}\n{m.sql.rstrip()}\n{record}\n")
    return "\n".join(parts)


def _literal(value: object) -> str:
    return str(value) if isinstance(value, int) else f"'{value}'"


async def applied_records(conn: psycopg.AsyncConnection[Any]) -> dict[int, tuple[str, str | None]]:
    """Applied migration versions → (checksum, the oldest release that runs beside it); empty
    on a database never migrated."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT to_regclass('outboxkit.schema_migrations') IS NOT NULL AS t")
        row = await cur.fetchone()
        if row is None or not row["t"]:
            return {}
        # SELECT *: runs_beside exists from migration 0007 on.
        await cur.execute("SELECT * FROM outboxkit.schema_migrations")
        return {
            int(r["version"]): (str(r["checksum"]), r.get("runs_beside"))
            for r in await cur.fetchall()
        }


async def applied_versions(conn: psycopg.AsyncConnection[Any]) -> dict[int, str]:
    """Applied migration versions and their checksums (empty on a database never migrated)."""
    return {v: checksum for v, (checksum, _) in (await applied_records(conn)).items()}


async def pending_migrations(conn: psycopg.AsyncConnection[Any]) -> list[Migration]:
    records = await applied_records(conn)
    return not_applied(
        load_migrations(),
        {v: checksum for v, (checksum, _) in records.items()},
        {v: oldest for v, (_, oldest) in records.items()},
    )


async def migrate(conn: psycopg.AsyncConnection[Any]) -> list[Migration]:
    """Apply every pending migration, each in its own transaction; return those applied.

    ``conn`` must be in autocommit mode (no transaction open)."""
    if not conn.autocommit:
        raise MigrationError("migrate() needs a connection in autocommit mode")
    applied: list[Migration] = []
    while True:
        async with conn.transaction():
            # Held to the end of this transaction: a concurrent migrator waits here, then sees
            # what this one applied.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_LOCK_KEY,))
            pending = await pending_migrations(conn)
            if not pending:
                return applied
            migration = pending[0]
            await conn.execute(migration.sql)
            await conn.execute(*_record(migration))
            applied.append(migration)
