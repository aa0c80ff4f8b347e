"""Versioned schema migrations, one ordered stream of files per database:
``files/postgres/NNNN_*.sql`` (applied by :mod:`.postgres`) and ``files/mongodb/NNNN_*.json``
(database commands, applied by :mod:`.mongodb`). This module reads the files; it imports no
database driver.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from outboxkit._version import __version__
from outboxkit.core.exceptions import OutboxkitError
from outboxkit.migrations.compat import release

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.(sql|json)$")


class MigrationError(OutboxkitError):
    """The database schema could not be migrated."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    #: Which database's migration: its text is SQL (postgresql) or JSON commands (mongodb).
    kind: Literal["postgresql", "mongodb"] = "postgresql"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


#: Each database's folder under ``files/``, by its URL scheme.
_FOLDERS = {"postgresql": "postgres", "mongodb": "mongodb"}


def load_migrations(backend: Literal["postgresql", "mongodb"] = "postgresql") -> list[Migration]:
    """The migrations shipped with this version of outboxkit for ``backend``, in order."""
    folder = importlib.resources.files(__name__).joinpath("files", _FOLDERS[backend])
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match[1]), match[2], text, backend))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations must be numbered 1, 2, 3, … without gaps: {versions}")
    return found


def not_applied(
    known: list[Migration],
    applied: dict[int, str],
    runs_beside: Mapping[int, str | None] | None = None,
) -> list[Migration]:
    """Of ``known``, those not in ``applied`` (version → checksum). Migrations applied that this
    version does not know (a newer release migrated: a rolling deploy, docs/upgrading.md) are
    fine when ``runs_beside`` (version → the oldest release that runs beside it, as the newer
    release recorded it) lets this release run beside them all; one whose file changed since
    is an error."""
    unknown = sorted(set(applied) - {m.version for m in known})
    if runs_beside is None:  # nothing says this release may run beside them
        blocking: dict[int, str | None] = dict.fromkeys(unknown)
    else:  # each recorded by the release that applied it (None: an expand-only migration)
        blocking = {
            v: oldest
            for v in unknown
            if (oldest := runs_beside.get(v)) is not None and release(oldest) > release(__version__)
        }
    if blocking:
        needs = sorted({o for o in blocking.values() if o is not None}, key=release)
        raise MigrationError(
            f"the database has migrations {sorted(blocking)} that outboxkit {__version__} "
            "cannot run beside: upgrade outboxkit" + (f" to {needs[-1]} or later" if needs else "")
        )
    changed = [m.label for m in known if m.version in applied and applied[m.version] != m.checksum]
    if changed:
        raise MigrationError(f"applied migrations differ from this version's files: {changed}")
    return [m for m in known if m.version not in applied]
