"""The command line without servers: every command documents itself, and a bad setting is a
usage error (exit 2) whose message says what to fix."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from outboxkit.cli import _inbox_runs_by_default, app
from outboxkit.cli import dev as dev_cli
from outboxkit.cli.common import run_on_loop, run_worker
from outboxkit.cli_options import PER_INVOCATION
from outboxkit.core.kafka import missing_topics
from outboxkit.dev import DevEnvironment
from tests.docs_snippets import REPO

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
        ("topics", "create"),
        ("topics", "describe"),
        ("dev", "up"),
        ("dev", "down"),
        ("dev", "env"),
        ("dev", "jars"),
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


def _options(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    found = [(" ".join(path), p) for p in getattr(command, "params", [])]
    for name, sub in getattr(command, "commands", {}).items():
        found += _options(sub, (*path, name))
    return found


def test_every_option_has_an_environment_twin_or_is_a_per_invocation_flag() -> None:
    """README and --help claim it: options that say where things are or how a worker runs
    have an OUTBOXKIT_* twin; per-invocation flags (cli_options.PER_INVOCATION) have none. The
    Spark pipeline's options are its own (outboxkit.pipeline.cli) and all have twins."""
    missing = [
        f"{path}: {param.name}"
        for path, param in _options(typer.main.get_command(app))
        if not param.envvar and param.name not in PER_INVOCATION
    ]
    assert not missing, missing
    readme = (REPO / "README.md").read_text()
    assert "Every flag has an `OUTBOXKIT_*` environment variable twin" not in readme


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "outboxkit")
def test_help_is_plain_text_without_type_placeholders(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert "<bool>" not in result.output
    assert "╭" not in result.output  # no boxes: plain text wrapped to the terminal
    # #44: the Spark pipeline's options showed <str> and <int> too.
    options = [line for line in result.output.splitlines() if line.startswith("  --")]
    assert not [line for line in options if "<" in line.split("  ")[1]], options
    # Arguments too: no "<str>" after a metavar, no braces around it in the usage line (it
    # read "{MODULE[:REGISTRY]}" and "MODULE[:REGISTRY] <str>").
    assert "<str>" not in result.output, result.output
    usage = result.output.splitlines()[0]
    assert "{" not in usage, usage


def test_pipeline_run_shows_its_defaults_as_the_other_commands_do() -> None:
    """#44: `pipeline run --help` left out most defaults."""
    result = runner.invoke(app, ["pipeline", "run", "--help"], terminal_width=200)
    for default in (
        "default: available-now]",
        "default: 3600]",
        "default: outboxkit]",
        "default: local[*]]",
        "default: (<output>/_checkpoints)]",
    ):
        assert default in result.output, result.output


def test_a_missing_topic_names_the_command_that_creates_it() -> None:
    message = str(missing_topics(["orders", "orders.dlq", "payments"]))
    assert "`outboxkit topics create orders payments`" in message
    assert "\n" not in message


def test_a_missing_topic_that_resembles_one_that_exists_is_named_with_it() -> None:
    existing = ["orders", "payments", "__consumer_offsets"]
    message = str(missing_topics(["ordrs"], existing))
    assert message.startswith("topic ordrs does not exist on Kafka (did you mean orders?): ")
    several = str(missing_topics(["ordrs", "paymnts", "refunds"], existing))
    assert "(ordrs: did you mean orders?; paymnts: did you mean payments?)" in several
    assert "did you mean __" not in str(missing_topics(["consumer_offsets"], existing))
    assert "did you mean" not in str(missing_topics(["refunds"], existing))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTBOXKIT_SESSION_TIMEOUT": "soon"}, "OUTBOXKIT_SESSION_TIMEOUT"),
        ({"OUTBOXKIT_TOPICS": ""}, "OUTBOXKIT_TOPICS"),
        ({"OUTBOXKIT_DATABASE_URL": "mysql://x/y"}, "OUTBOXKIT_DATABASE_URL"),
        ({"OUTBOXKIT_EVENT_LOOP": "trio"}, "OUTBOXKIT_EVENT_LOOP"),
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
    assert _inbox_runs_by_default(["--debug", "inbox", "m:i"]) == ["--debug", "inbox", "run", "m:i"]
    assert _inbox_runs_by_default(["inbox", "dlq", "list"]) == ["inbox", "dlq", "list"]
    assert _inbox_runs_by_default(["inbox", "--help"]) == ["inbox", "--help"]


class _DoneWorker:
    """A worker that has nothing to do: run_worker's set-up alone."""

    async def run(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def health(self) -> Any:
        return None


def test_worker_processes_freeze_startup_objects_and_collect_young_ones_less_often() -> None:
    """The relay's drain and the inbox spent about a third of their CPU in collections."""
    before = gc.get_threshold()
    try:
        asyncio.run(run_worker(_DoneWorker(), None))
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


async def _running_loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_workers_run_on_asyncio_unless_told_uvloop() -> None:
    assert run_on_loop(_running_loop_module(), "asyncio").startswith("asyncio")
    assert run_on_loop(_running_loop_module(), "uvloop").startswith("uvloop")


def test_asking_for_uvloop_without_it_is_exit_2_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    for name, value in {
        "OUTBOXKIT_DATABASE_URL": "postgresql://localhost/db",
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_EVENT_LOOP": "uvloop",
    }.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, ["relay"])
    assert result.exit_code == 2, result.output
    assert "pip install 'outboxkit[uvloop]'" in result.output


def test_dev_up_says_its_postgresql_lets_any_password_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A wrong password works against `outboxkit dev up` (trust authentication) and then fails
    on a real server: unsaid, a newcomer learnt it from the first deploy."""
    running = DevEnvironment(
        pid=1, broker="kafka", env={"OUTBOXKIT_DATABASE_URL": "postgresql://x"}
    )
    monkeypatch.setattr(dev_cli, "status", lambda directory: running)
    monkeypatch.setattr(dev_cli, "up", lambda directory, broker: running)
    result = runner.invoke(app, ["dev", "up", "--directory", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "export OUTBOXKIT_DATABASE_URL=postgresql://x" in result.stdout
    assert "trusts every local login (any user, any password)" in result.stderr
