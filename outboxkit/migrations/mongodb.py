"""MongoDB migrations: each ``mongodb/NNNN_name.json`` file is a list of database commands
(``create``, ``createIndexes``, …), each with a ``why``, applied in order.

Every command is idempotent (``create`` of an existing collection is skipped, ``createIndexes``
of an identical index does nothing, ``dropIndexes`` of a dropped one is skipped), so two
``outboxkit migrate`` runs at once both succeed;
the applied versions are recorded in ``outboxkit.migrations`` with the file's checksum, which
``outboxkit check`` compares like on PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import DuplicateKeyError, OperationFailure

from outboxkit.core.mongodb import Database, collection
from outboxkit.migrations import Migration, load_migrations, not_applied
from outboxkit.migrations.compat import runs_beside

#: "NamespaceExists": the collection is there already; "IndexNotFound": a concurrent migrate
#: dropped it first.
_ALREADY_DONE = {48, 27}


async def applied_records(db: Database) -> dict[int, tuple[str, str | None]]:
    """Applied migration versions → (checksum, the oldest release that runs beside it: the
    record's ``runs_beside``, written by the release that applied it, absent when expand-only)."""
    return {
        int(doc["_id"]): (str(doc["checksum"]), doc.get("runs_beside"))
        async for doc in collection(db, "migrations").find()
    }


async def applied_versions(db: Database) -> dict[int, str]:
    return {v: checksum for v, (checksum, _) in (await applied_records(db)).items()}


async def pending_migrations(db: Database) -> list[Migration]:
    records = await applied_records(db)
    return not_applied(
        load_migrations("mongodb"),
        {v: checksum for v, (checksum, _) in records.items()},
        {v: oldest for v, (_, oldest) in records.items()},
    )


async def migrate(db: Database) -> list[Migration]:
    """Apply every pending migration to ``db``; return those applied."""
    applied = []
    for migration in await pending_migrations(db):
        for step in json.loads(migration.sql):
            await _run(db, step["command"])
        try:
            await collection(db, "migrations").insert_one(
                {
                    "_id": migration.version,
                    "name": migration.name,
                    "checksum": migration.checksum,
                    "applied_at": datetime.now(UTC),
                    "runs_beside": runs_beside(migration),
                }
            )
        except DuplicateKeyError:
            continue  # a concurrent `migrate` recorded it first
        applied.append(migration)
    return applied


async def _run(db: Database, command: dict[str, Any]) -> None:
    try:
        await db.command(command)
    except OperationFailure as exc:
        if exc.code not in _ALREADY_DONE:
            raise
