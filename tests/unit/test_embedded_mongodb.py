"""Where the embedded mongod comes from, and that it never becomes part of outboxkit (SSPL)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded.mongodb import FETCH_COMMAND, fetch_mongod, find_mongod, mongod_cache_dir
from outboxkit.embedded.mongodb.__main__ import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("OUTBOXKIT_MONGOD", raising=False)
    return tmp_path


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_missing_mongod_names_the_fetch_command(home: Path) -> None:
    with pytest.raises(ConfigurationError) as error:
        find_mongod()
    assert FETCH_COMMAND in str(error.value)
    assert "OUTBOXKIT_MONGOD" in str(error.value)


def test_the_cache_is_per_version_under_the_outboxkit_cache(home: Path) -> None:
    assert mongod_cache_dir() == home / ".cache/outboxkit/mongodb-6.0.5"
    cached = _executable(mongod_cache_dir() / "mongod")
    assert find_mongod() == cached
    assert fetch_mongod() == cached  # idempotent: nothing downloaded when it is there


def test_outboxkit_mongod_wins_over_the_cache(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _executable(mongod_cache_dir() / "mongod")
    mine = _executable(home / "bin" / "mongod")
    monkeypatch.setenv("OUTBOXKIT_MONGOD", str(mine))
    assert find_mongod(fetch=True) == mine


def test_outboxkit_mongod_must_be_an_executable(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_MONGOD", str(home / "nothing-here"))
    with pytest.raises(ConfigurationError, match="not an executable file"):
        find_mongod(fetch=True)


def test_the_fetch_command_prints_the_binary(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cached = _executable(mongod_cache_dir() / "mongod")
    main(["fetch"])
    assert capsys.readouterr().out == f"{cached}\n"
    monkeypatch.setenv("OUTBOXKIT_MONGOD", str(home / "nothing-here"))
    with pytest.raises(SystemExit):
        main(["fetch"])
    assert "error: OUTBOXKIT_MONGOD" in capsys.readouterr().err


def test_mongod_is_never_a_dependency_nor_in_the_repository() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    assert not [r for r in requirements if "fiftyone" in r or "mongodb-server" in r]
    shipped = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"build", "dist"}]
        shipped += [Path(folder, f) for f in files if f == "mongod" or f.endswith(".whl")]
    assert not shipped
