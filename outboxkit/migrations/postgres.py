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
from psycopg.rows import tuple_row

from outboxkit.migrations import Migration, MigrationError, load_migrations, not_applied

#: Serializes concurrent `migrate` runs across processes (an arbitrary constant: "outboxkt").
_ADVISORY_LOCK_KEY = 0x6F7574626F786B74


def script(migrations: list[Migration]) -> str:
    """One SQL script that applies ``migrations`` and records them, for external tools."""
    parts = []
    for m in migrations:
        record = (
            "INSERT INTO outboxkit.schema_migrations (version, name, checksum) "
            f"VALUES ({m.version}, '{m.name}', '{m.checksum}');"
        )
        parts.append(f"-- outboxkit migration {m.label}\n{m.sql.rstrip()}\n{record}\n")
    return "\n".join(parts)


async def applied_versions(conn: psycopg.AsyncConnection[Any]) -> dict[int, str]:
    """Applied migration versions and their checksums (empty on a database never migrated)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute("SELECT to_regclass('outboxkit.schema_migrations') IS NOT NULL")
        row = await cur.fetchone()
        if row is None or not row[0]:
            return {}
        await cur.execute("SELECT version, checksum FROM outboxkit.schema_migrations")
        return {int(version): str(checksum) for version, checksum in await cur.fetchall()}


async def pending_migrations(conn: psycopg.AsyncConnection[Any]) -> list[Migration]:
    return not_applied(load_migrations(), await applied_versions(conn))


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
            await conn.execute(
                "INSERT INTO outboxkit.schema_migrations (version, name, checksum) "
                "VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            applied.append(migration)
