"""The command line without servers: every command documents itself, and a bad setting is a
usage error (exit 2) whose message says what to fix."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from outboxkit.cli import _inbox_runs_by_default, app

runner = CliRunner()


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``command`` (typer bundles its own click: duck-typed)."""
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, (*path, name))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


def test_the_operators_commands_exist() -> None:
    expected = {
        ("check",),
        ("migrate",),
        ("relay",),
        ("relay", "status"),
        ("inbox", "run"),
        ("inbox", "dlq", "list"),
        ("inbox", "dlq", "replay"),
        ("outbox", "pending"),
        ("outbox", "failed"),
        ("outbox", "retry"),
        ("outbox", "skip"),
        ("outbox", "replay"),
        ("topics", "sync"),
        ("demo",),
        ("pipeline",),
    }
    assert expected <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "outboxkit")
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_options_show_their_environment_variable() -> None:
    result = runner.invoke(app, ["relay", "--help"], terminal_width=200)
    assert "OUTBOXKIT_DATABASE_URL" in result.output


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTBOXKIT_SESSION_TIMEOUT": "soon"}, "OUTBOXKIT_SESSION_TIMEOUT"),
        ({"OUTBOXKIT_TOPICS": ""}, "OUTBOXKIT_TOPICS"),
        ({"OUTBOXKIT_DATABASE_URL": "mysql://x/y"}, "OUTBOXKIT_DATABASE_URL"),
    ],
)
def test_a_bad_setting_is_exit_2_with_what_to_fix(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {"OUTBOXKIT_DATABASE_URL": "postgresql://localhost/db", "OUTBOXKIT_TOPICS": "orders"}
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, ["relay"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_inbox_runs_a_module_by_default() -> None:
    assert _inbox_runs_by_default(["inbox", "m:inbox"]) == ["inbox", "run", "m:inbox"]
    assert _inbox_runs_by_default(["inbox", "dlq", "list"]) == ["inbox", "dlq", "list"]
    assert _inbox_runs_by_default(["inbox", "--help"]) == ["inbox", "--help"]
