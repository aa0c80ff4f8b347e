"""Versioned schema migrations, one ordered stream of files per backend: ``postgresql/NNNN_*.sql``
(applied here) and ``mongodb/NNNN_*.json`` (database commands, applied by :mod:`.mongo`).

Users who run their own migration tool (Alembic, Flyway, …) print the SQL with
``outboxkit migrate --sql`` and apply it there; the ``outboxkit.schema_migrations`` rows it
inserts keep ``outboxkit check`` and ``outboxkit migrate`` in agreement with that tool.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import tuple_row

from outboxkit.core.exceptions import OutboxkitError

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.(sql|json)$")

#: Serializes concurrent `migrate` runs across processes (an arbitrary constant: "outboxkt").
_ADVISORY_LOCK_KEY = 0x6F7574626F786B74


class MigrationError(OutboxkitError):
    """The database schema could not be migrated."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def load_migrations(backend: Literal["postgresql", "mongodb"] = "postgresql") -> list[Migration]:
    """The migrations shipped with this version of outboxkit for ``backend``, in order."""
    folder = importlib.resources.files(__name__).joinpath(backend)
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations must be numbered 1, 2, 3, … without gaps: {versions}")
    return found


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


def not_applied(known: list[Migration], applied: dict[int, str]) -> list[Migration]:
    """Of ``known``, those not in ``applied`` (version → checksum); an applied migration this
    version does not know, or one whose file changed since, is an error."""
    unknown = sorted(set(applied) - {m.version for m in known})
    if unknown:
        raise MigrationError(
            f"the database has migrations {unknown} that this outboxkit version does not know: "
            "upgrade outboxkit"
        )
    changed = [m.label for m in known if m.version in applied and applied[m.version] != m.checksum]
    if changed:
        raise MigrationError(f"applied migrations differ from this version's files: {changed}")
    return [m for m in known if m.version not in applied]


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
