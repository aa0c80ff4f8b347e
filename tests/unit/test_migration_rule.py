"""The migration rule (docs/upgrading.md): a migration never removes or changes what the
previous release reads or writes, unless it is a contract step marked with the release it runs
beside (``runs beside >= X``), shipped after tag ``vX``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from outboxkit._version import __version__
from outboxkit.migrations import Migration, MigrationError, load_migrations, not_applied
from outboxkit.migrations.compat import contract_steps, incompatible, release, runs_beside
from tests.previous_release import releases

REPO = Path(__file__).resolve().parents[2]

#: Migrations written before the rule, each with why it is let through. Nothing may join.
BEFORE_THE_RULE = {
    # Creates outbox_head_idx and drops outbox_pending_idx at once: a relay built before it
    # fails its reads afterwards (docs/upgrading.md, "Supported upgrade paths").
    ("mongodb", "0002_head_index"),
}

#: tag_holds(release, migration): None when the release is not made (no tag v<release>, no
#: commit recorded in CHANGELOG.md), else whether its commit already holds the migration's file.
TagHolds = Callable[[str, Migration], bool | None]


def _path(migration: Migration) -> str:
    folder, ext = ("postgres", "sql") if migration.kind == "postgresql" else ("mongodb", "json")
    return f"outboxkit/migrations/files/{folder}/{migration.label}.{ext}"


def git_tag_holds(version: str, migration: Migration) -> bool | None:
    made = releases().get(version)  # its tag, or the commit CHANGELOG.md records
    if made is None:
        return None
    commit, _ = made
    held = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}:{_path(migration)}"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    return held.returncode == 0


def violations(migration: Migration, tag_holds: TagHolds = git_tag_holds) -> list[str]:
    """What breaks the rule in ``migration``."""
    found = []
    for step in contract_steps(migration):
        if step.contract is None:
            found.append(f"{migration.label}: {step.what}, not marked as a contract step")
            continue
        if release(step.contract) > release(__version__):
            found.append(f"{migration.label}: runs beside {step.contract}, a later release")
        held = tag_holds(step.contract, migration)
        if held is None:
            found.append(f"{migration.label}: v{step.contract} is not a tag (not released)")
        elif held:
            found.append(
                f"{migration.label}: v{step.contract} already holds it: a contract ships after "
                "the release it names"
            )
    return found


@pytest.mark.parametrize("kind", ["postgresql", "mongodb"])
def test_every_shipped_migration_obeys_the_rule(kind: str) -> None:
    broken = {}
    for migration in load_migrations(kind):  # type: ignore[arg-type]
        if problems := violations(migration):
            broken[(kind, migration.label)] = problems
    excused = {key for key in broken if key in BEFORE_THE_RULE}
    assert {k: v for k, v in broken.items() if k not in excused} == {}
    # An exception that no longer breaks the rule goes from the list.
    assert excused == {key for key in BEFORE_THE_RULE if key[0] == kind}


def _sql(text: str, version: int = 99) -> Migration:
    return Migration(version, "change", text, "postgresql")


def _mongo(*steps: dict[str, object], version: int = 99) -> Migration:
    return Migration(version, "change", json.dumps(list(steps)), "mongodb")


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE outboxkit.relay_waiting;",
        "DROP INDEX IF EXISTS outboxkit.outbox_pending_idx;",
        "ALTER TABLE outboxkit.outbox DROP COLUMN attempts;",
        "DROP FUNCTION outboxkit.wake_relay() CASCADE;",
        "DROP TRIGGER outbox_wake_relay ON outboxkit.outbox;",
        "ALTER TABLE outboxkit.outbox RENAME COLUMN key TO record_key;",
        "ALTER TABLE outboxkit.inbox RENAME TO dedupe;",
        "ALTER INDEX outboxkit.outbox_failed_idx RENAME TO failed_idx;",
        "ALTER TABLE outboxkit.outbox ALTER COLUMN partition TYPE bigint;",
        "ALTER TABLE outboxkit.outbox ALTER partition SET DATA TYPE bigint;",
        "ALTER TABLE outboxkit.outbox ALTER COLUMN value SET NOT NULL;",
        "ALTER TABLE outboxkit.outbox ADD COLUMN tenant text NOT NULL;",
        "ALTER TABLE outboxkit.outbox ADD CONSTRAINT short_keys CHECK (length(key) < 100);",
        "ALTER TABLE outboxkit.outbox ALTER COLUMN state DROP DEFAULT;",
        "TRUNCATE outboxkit.relay_waiting;",
        # A comment does not hide what follows it on the next line.
        "-- harmless\nALTER TABLE outboxkit.outbox\n    DROP COLUMN last_error;",
    ],
)
def test_a_sql_contract_step_is_refused_unmarked(sql: str) -> None:
    assert violations(_sql(sql)), sql


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE outboxkit.things (id bigint PRIMARY KEY, name text NOT NULL);",
        "ALTER TABLE outboxkit.outbox ADD COLUMN tenant text;",
        "ALTER TABLE outboxkit.outbox ADD COLUMN tenant text NOT NULL DEFAULT 'main';",
        "CREATE INDEX outbox_tenant_idx ON outboxkit.outbox (tenant);",
        "ALTER TABLE outboxkit.outbox ALTER COLUMN value DROP NOT NULL;",
        # A comment that talks about dropping is not a drop.
        "-- a later release may DROP this column\nALTER TABLE outboxkit.outbox ADD COLUMN x int;",
        "CREATE OR REPLACE FUNCTION outboxkit.f() RETURNS int LANGUAGE plpgsql AS $$\n"
        "BEGIN DROP TABLE IF EXISTS tmp; RETURN 1; END; $$;",
    ],
)
def test_a_sql_expand_step_passes(sql: str) -> None:
    assert violations(_sql(sql)) == [], sql


@pytest.mark.parametrize(
    "command",
    [
        {"dropIndexes": "outboxkit.outbox", "index": "outbox_pending_idx"},
        {"drop": "outboxkit.keys"},
        {"renameCollection": "db.outboxkit.inbox", "to": "db.outboxkit.dedupe"},
        {"collMod": "outboxkit.outbox", "validator": {"$jsonSchema": {"required": ["tenant"]}}},
        {"collMod": "outboxkit.outbox", "index": {"name": "outbox_head_idx", "hidden": True}},
    ],
)
def test_a_mongodb_contract_step_is_refused_unmarked(command: dict[str, object]) -> None:
    assert violations(_mongo({"why": "…", "command": command})), command


@pytest.mark.parametrize(
    "command",
    [
        {"create": "outboxkit.things"},
        {"createIndexes": "outboxkit.outbox", "indexes": [{"name": "i", "key": {"a": 1}}]},
        {"collMod": "outboxkit.outbox", "changeStreamPreAndPostImages": {"enabled": True}},
    ],
)
def test_a_mongodb_expand_step_passes(command: dict[str, object]) -> None:
    assert violations(_mongo({"why": "…", "command": command})) == []


def _tags(**held: bool) -> TagHolds:
    """Tags v<version> (keys: 0_1_0 for 0.1.0) and whether each already holds the file."""
    return lambda version, _: held.get(version.replace(".", "_"))


def test_a_marked_contract_step_passes_once_its_release_is_tagged_without_it() -> None:
    sql = _sql("-- contract: runs beside >= 0.1.0\nDROP INDEX outboxkit.outbox_pending_idx;")
    assert runs_beside(sql) == "0.1.0"
    assert violations(sql, _tags(**{"0_1_0": False})) == []
    # Not tagged yet: the release it names has not shipped.
    assert "not a tag" in violations(sql, _tags())[0]
    # Shipped in the very release it names: expand and contract together.
    assert "already holds it" in violations(sql, _tags(**{"0_1_0": True}))[0]
    step = {
        "why": "…",
        "contract": "runs beside >= 0.1.0",
        "command": {"dropIndexes": "outboxkit.outbox", "index": "outbox_pending_idx"},
    }
    assert violations(_mongo(step), _tags(**{"0_1_0": False})) == []
    assert runs_beside(_mongo(step)) == "0.1.0"


def test_a_marker_naming_a_release_after_this_one_is_refused() -> None:
    major, minor, patch = release(__version__)[:3]
    later = f"{major}.{minor}.{patch + 1}"
    sql = _sql(f"-- contract: runs beside >= {later}\nDROP TABLE outboxkit.relay_waiting;")
    assert "a later release" in violations(sql, _tags(**{later.replace(".", "_"): False}))[0]


def test_releases_compare_by_number() -> None:
    assert release("0.10.0") > release("0.9.1") > release("0.9") == release("0.9.0")


def test_a_build_before_a_release_is_older_than_it() -> None:
    """A relay built from the code between 0.1.0 and 0.1.1 reports 0.1.1.dev0: older than
    0.1.1 (a contract step that 0.1.1 runs beside may remove what it still uses), newer than
    0.1.0."""
    assert release("0.1.0") < release("0.1.1.dev0") < release("0.1.1")
    assert release("0.1.0.post1") < release("0.1.1rc1") < release("0.1.1") == release("0.1.1+local")


def test_workers_run_beside_what_their_release_allows() -> None:
    known = load_migrations()
    applied = {m.version: m.checksum for m in known}
    newer = max(applied) + 1
    # An expand migration of a newer release (recorded with no runs_beside): fine.
    assert not_applied(known, {**applied, newer: "x"}, {newer: None}) == []
    # A contract naming this release: fine; naming a later one: upgrade.
    assert not_applied(known, {**applied, newer: "x"}, {newer: __version__}) == []
    with pytest.raises(MigrationError, match=r"upgrade outboxkit to 99\.0 or later"):
        not_applied(known, {**applied, newer: "x"}, {newer: "99.0"})
    # Nothing recorded about it (a database the caller did not read runs_beside from).
    with pytest.raises(MigrationError, match="cannot run beside"):
        not_applied(known, {**applied, newer: "x"})


def test_migrate_check_compares_pending_contracts_with_running_releases() -> None:
    expand = _sql("ALTER TABLE outboxkit.outbox ADD COLUMN tenant text;")
    contract = _sql("-- contract: runs beside >= 0.3.0\nALTER TABLE outboxkit.outbox DROP x;")
    assert incompatible([expand], {None: 2, "0.1.0": 1}) == []
    assert incompatible([contract], {"0.3.0": 2, "0.4.1": 1}) == []
    problems = incompatible([expand, contract], {"0.2.9": 1, None: 2, "0.3.0": 1})
    assert len(problems) == 2
    assert any("0.2.9" in p for p in problems)
    assert any("unknown release" in p for p in problems)
