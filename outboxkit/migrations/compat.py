"""Which releases of outboxkit can run beside a migration (docs/upgrading.md).

Migrations are *expand* steps — a table, a column, an index or a function added — that release
N-1 (which knows nothing of them) runs beside, and *contract* steps, which remove or change
something an earlier release reads or writes. A contract step is marked with the oldest
release that no longer uses what it removes, and ships in a later release than that one:

- PostgreSQL, a line of the file: ``-- contract: runs beside >= 0.2.0``
- MongoDB, a key of the step: ``{"why": …, "contract": "runs beside >= 0.2.0", "command": …}``

:func:`contract_steps` finds the steps that remove or change something (an unmarked one is
refused by ``tests/unit/test_migration_rule.py``); :func:`runs_beside` reads the marker;
:func:`incompatible` says which running workers a pending migration would break.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outboxkit.migrations import Migration

_SQL_MARKER = re.compile(r"^--\s*contract:\s*runs beside >=\s*(\S+)\s*$", re.MULTILINE)
_JSON_MARKER = re.compile(r"^runs beside >=\s*(\S+)$")

#: What removes or changes a thing an earlier release reads or writes (PostgreSQL), found in a
#: statement with its comments taken out.
_SQL_CONTRACTS = [
    (re.compile(r"\bDROP\s+(?!NOT\s+NULL\b)(\w+)", re.I), "drops a {0}"),
    (re.compile(r"\bRENAME\b", re.I), "renames something"),
    (re.compile(r"\bALTER\s+(?:COLUMN\s+)?\w+\s+(?:SET\s+DATA\s+)?TYPE\b", re.I), "changes a type"),
    (re.compile(r"\bSET\s+NOT\s+NULL\b", re.I), "makes a column NOT NULL"),
    (
        re.compile(r"\bADD\s+(?:CONSTRAINT\s+\w+\s+)?(?:CHECK|UNIQUE|FOREIGN)\b", re.I),
        "adds a constraint",
    ),
    (re.compile(r"\bTRUNCATE\b", re.I), "truncates a table"),
]
_ADD_COLUMN = re.compile(r"\bADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\w+\s+[^,;]*", re.I)
_MONGO_REMOVING = {"drop", "dropIndexes", "dropDatabase", "renameCollection", "deleteIndexes"}
#: collMod options that can refuse an earlier release's writes or take an index from its reads.
_COLLMOD_CHANGING = {"validator", "validationLevel", "validationAction", "index"}


@dataclass(frozen=True)
class Step:
    """One statement or command of a migration that removes or changes something."""

    what: str
    #: The release named by its contract marker, or None (unmarked).
    contract: str | None


def release(version: str) -> tuple[int, ...]:
    """A version as releases compare: by their numbers (``0.10.0`` > ``0.9.1``, ``0.9`` =
    ``0.9.0``), and a build before a release (``0.2.0.dev0``, ``0.2.0rc1``: anything after the
    numbers but a ``+local`` label or ``.postN``) older than that release and newer than every
    earlier one: ``0.2.0`` → ``(0, 2, 0, 1)``, ``0.2.0.dev0`` → ``(0, 2, 0, 0)``."""
    found = re.match(r"(\d+(?:\.\d+)*)(.*)", version.strip())
    if found is None:
        raise ValueError(f"not a release number: {version!r}")
    numbers = [int(n) for n in found[1].split(".")]
    numbers += [0] * (3 - len(numbers))
    before = found[2].split("+", 1)[0]
    final = not before or re.fullmatch(r"\.?post\d*", before) is not None
    return (*numbers, 1 if final else 0)


def _strip_sql_comments(sql: str) -> str:
    sql = re.sub(r"--[^\n]*", "", sql)
    return re.sub(r"/\*.*?\*/", "", sql, flags=re.S)


def _statements(sql: str) -> list[str]:
    """``sql`` split at semicolons outside dollar-quoted bodies (a function's body is one
    statement with the CREATE around it)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for piece in re.split(r"(\$\w*\$|;)", sql):
        if re.fullmatch(r"\$\w*\$", piece):
            quoted = not quoted
        if piece == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(piece)
    parts.append("".join(current))
    return [" ".join(p.split()) for p in parts if p.strip()]


def contract_steps(migration: Migration) -> list[Step]:
    """The steps of ``migration`` that remove or change something an earlier release may read
    or write, each with the release its contract marker names (None when unmarked)."""
    if migration.kind == "mongodb":
        return _mongodb_steps(json.loads(migration.sql))
    marker = _SQL_MARKER.search(migration.sql)
    contract = marker[1] if marker else None
    found: list[Step] = []
    for statement in _statements(_strip_sql_comments(migration.sql)):
        if re.match(r"CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\b", statement, re.I):
            # A body replaced under the same name, arguments and result (PostgreSQL refuses to
            # change the result type in place) is an expand step; what it does is reviewed.
            continue
        for pattern, what in _SQL_CONTRACTS:
            match = pattern.search(statement)
            if match:
                found.append(Step(f"{what.format(*match.groups())}: {statement[:80]}", contract))
        for added in _ADD_COLUMN.finditer(statement):
            column = added[0]
            if re.search(r"\bNOT\s+NULL\b", column, re.I) and not re.search(
                r"\bDEFAULT\b", column, re.I
            ):
                found.append(
                    Step(f"adds a NOT NULL column without a default: {statement[:80]}", contract)
                )
    return found


def _mongodb_steps(steps: Iterable[Mapping[str, Any]]) -> list[Step]:
    found = []
    for step in steps:
        command: Mapping[str, Any] = step["command"]
        name = next(iter(command))
        marker = _JSON_MARKER.match(str(step.get("contract", "")))
        contract = marker[1] if marker else None
        if name in _MONGO_REMOVING:
            found.append(Step(f"{name} {command[name]}", contract))
        elif name == "collMod" and _COLLMOD_CHANGING & command.keys():
            options = sorted(_COLLMOD_CHANGING & command.keys())
            found.append(Step(f"collMod {command[name]} ({', '.join(options)})", contract))
    return found


def runs_beside(migration: Migration) -> str | None:
    """The oldest release that can run beside ``migration`` (the newest its contract steps
    name), or None for an expand-only migration: every release that runs on the schema before
    it runs beside it."""
    named = [s.contract for s in contract_steps(migration) if s.contract is not None]
    if migration.kind == "postgresql":
        marker = _SQL_MARKER.search(migration.sql)
        if marker:
            named.append(marker[1])
    return max(named, key=release) if named else None


def incompatible(pending: Iterable[Migration], running: Mapping[str | None, int]) -> list[str]:
    """Why running workers (version → how many; None: a release before presence carried its
    version) cannot run beside ``pending`` migrations; empty when they all can."""
    problems = []
    for migration in pending:
        oldest = runs_beside(migration)
        if oldest is None:
            continue
        for version, count in sorted(running.items(), key=lambda v: str(v[0])):
            if version is None or release(version) < release(oldest):
                shown = "an unknown release (before presence carried versions)"
                shown = shown if version is None else version
                problems.append(
                    f"{migration.label} runs beside outboxkit >= {oldest} only: "
                    f"{count} running worker(s) of {shown}"
                )
    return problems
