"""A typo'd ``OUTBOXKIT_*`` variable is named at start with the closest one outboxkit reads
(``OUTBOXKIT_BATCHSIZE=5 outboxkit relay`` passed silently, ``OUTBOXKIT_DATABSE_URL`` only
yielded "OUTBOXKIT_DATABASE_URL is not set"); a warning, not an error, as other tools may share
the prefix. :func:`outboxkit.variables.known_variables` is the one list of what is read: every
variable the code, the docs, the examples, the tests and the benches name must be on it, and
every environment twin of a command's option."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
from structlog.testing import capture_logs

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import ConnectionSettings
from outboxkit.service import Outboxkit
from outboxkit.variables import (
    COMMAND_VARIABLES,
    SETTINGS,
    known_variables,
    load,
    unknown_variables,
)
from tests.docs_snippets import REPO

#: A variable's full name (a prefix such as ``OUTBOXKIT_KAFKA_SSL_*`` or an f-string's
#: ``OUTBOXKIT_{…}`` is not one).
_VARIABLE = re.compile(r"OUTBOXKIT_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_{])")
_SCANNED = [
    *("outboxkit", "core", "relay", "inbox", "pipeline", "schemas"),
    *("examples", "compose", "docs", "tests", "bench", "deploy"),
]
_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".example", ".env", ".tpl", ".json"}


def _named_variables() -> dict[str, str]:
    """Each variable named in the repository's code and docs, with one file that names it."""
    files = [REPO / "README.md", REPO / "pyproject.toml"]
    for top in _SCANNED:
        files += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in _SUFFIXES]
    named: dict[str, str] = {}
    this = REPO / "tests/unit/test_unknown_variables.py"  # its typos are on purpose
    for path in files:
        if path == this or "__pycache__" in path.parts or path.is_symlink():
            continue
        for name in _VARIABLE.findall(path.read_text(errors="replace")):
            named.setdefault(name, str(path.relative_to(REPO)))
    return named


def test_every_variable_the_repository_names_is_known() -> None:
    """Catches a variable read somewhere but missing from the one list (it would be warned about
    as unknown while it works), or a doc naming a variable nothing reads."""
    named = _named_variables()
    assert "OUTBOXKIT_DATABASE_URL" in named, "the scan found nothing"
    unknown = {name: where for name, where in named.items() if name not in known_variables()}
    assert not unknown, unknown


def _command_variables() -> set[str]:
    """The environment twins of the ``outboxkit`` commands' options, read from the commands."""
    import typer  # noqa: PLC0415

    from outboxkit.cli import app  # noqa: PLC0415

    found: set[str] = set()
    commands: list[Any] = [typer.main.get_command(app)]
    while commands:
        command = commands.pop()
        commands += getattr(command, "commands", {}).values()  # a group's
        for param in command.params:
            envvars = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
            found |= {v for v in envvars if isinstance(v, str) and v.startswith("OUTBOXKIT_")}
    return found


def test_the_commands_variables_are_the_listed_ones() -> None:
    """outboxkit.variables lists the commands' environment twins (so that a service checks its
    environment without loading the command line): catches an option added without its
    variable on the list, or a variable listed that no option has."""
    fields = {f"OUTBOXKIT_{name.upper()}" for t in SETTINGS for name in load(t).model_fields}
    commands = _command_variables()
    assert {"OUTBOXKIT_LOG_LEVEL", "OUTBOXKIT_HTTP_PORT", "OUTBOXKIT_DEMO_RATE"} <= commands
    assert commands - fields == COMMAND_VARIABLES
    assert commands <= known_variables()


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("OUTBOXKIT_BATCHSIZE", "OUTBOXKIT_BATCH_SIZE"),
        ("OUTBOXKIT_DATABSE_URL", "OUTBOXKIT_DATABASE_URL"),
        ("OUTBOXKIT_KAFKA_BOOTSTRAP_SERVER", "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS"),
        ("OUTBOXKIT_LOGLEVEL", "OUTBOXKIT_LOG_LEVEL"),
        ("OUTBOXKIT_GRAFANA_TOKEN", None),  # another tool's: named, nothing suggested
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_known_one(
    name: str, closest: str | None
) -> None:
    environ = {name: "5", "OUTBOXKIT_DATABASE_URL": "memory://x", "PATH": "/bin"}
    assert unknown_variables(environ) == [(name, closest)]


def test_the_command_warns_and_goes_on() -> None:
    """Catches a typo that passes silently (the setting left at its default), or one that stops
    the command (the prefix is not outboxkit's alone)."""
    result = subprocess.run(
        [sys.executable, "-m", "outboxkit", "migrate", "--sql"],
        env={"PATH": "/usr/bin:/bin", "OUTBOXKIT_BATCHSIZE": "5", "OUTBOXKIT_DATABSE_URL": "x"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "CREATE SCHEMA" in result.stdout.upper()
    assert result.stderr.splitlines() == [
        "warning: OUTBOXKIT_BATCHSIZE is not a variable outboxkit reads; did you mean "
        "OUTBOXKIT_BATCH_SIZE?",
        "warning: OUTBOXKIT_DATABSE_URL is not a variable outboxkit reads; did you mean "
        "OUTBOXKIT_DATABASE_URL?",
    ]


def test_a_service_warns_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_RELAY_NAMES", "orders")
    kit: Outboxkit = Outboxkit(
        source="urn:test", settings=ConnectionSettings(database_url="memory://unknown-variables")
    )
    with capture_logs() as logs:
        assert kit.database_url == "memory://unknown-variables"  # validates the settings
    warnings = [entry["event"] for entry in logs if entry["log_level"] == "warning"]
    assert warnings == [
        "OUTBOXKIT_RELAY_NAMES is not a variable outboxkit reads; did you mean "
        "OUTBOXKIT_RELAY_NAME?"
    ]


async def test_a_misspelt_required_setting_says_which_name_it_is_under(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The app of docs/getting-started.md, started with OUTBOXKIT_DATABSE_URL, failed with
    "OUTBOXKIT_DATABASE_URL is not set" and no hint (the warning came only after loading)."""
    monkeypatch.delenv("OUTBOXKIT_DATABASE_URL", raising=False)
    monkeypatch.setenv("OUTBOXKIT_DATABSE_URL", "postgresql://localhost/db")
    monkeypatch.setenv("OUTBOXKIT_TOPICS", "orders")
    kit = Outboxkit(source="orders", relay=True)
    with pytest.raises(ConfigurationError) as raised:
        await kit.__aenter__()
    message = str(raised.value)
    assert "OUTBOXKIT_DATABASE_URL is not set" in message
    assert "OUTBOXKIT_DATABSE_URL is set: did you mean OUTBOXKIT_DATABASE_URL?" in message
