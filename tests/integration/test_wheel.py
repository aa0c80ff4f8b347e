"""The release artefacts, as RELEASING.md makes them: `python -m build` builds the sdist and,
from it, the wheel, without warnings and with every migration; `twine check --strict` passes
both; the wheel installs by name (`pip install --find-links dist outboxkit`, as the docs say to
until outboxkit is on PyPI) in a clean virtualenv outside the repository, where `outboxkit
--version` and `import outboxkit` work and only `outboxkit.*` import names exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.integration.conftest import Built

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

PROBE = """
import importlib.util, json
import outboxkit, outboxkit.schemas, outboxkit.relay, outboxkit.inbox, outboxkit.migrations
from outboxkit.schemas import Event, EventRegistry, encode, partition_for_key
print(json.dumps({
    "version": outboxkit.__version__,
    "generic_names": [n for n in ("schemas", "relay", "inbox")
                      if importlib.util.find_spec(n) is not None],
    "migrations": [m.label for m in outboxkit.migrations.load_migrations()],
    "partition": partition_for_key("21", 16),
    "drivers": [n for n in ("psycopg", "psycopg_pool", "pymongo")
                if importlib.util.find_spec(n) is not None],
}))
"""


@pytest.mark.timeout(120)
def test_twine_check_passes(built: Built) -> None:
    """What PyPI would refuse or render badly (the README as the long description, metadata)."""
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


@pytest.mark.timeout(300)
def test_the_build_warns_of_nothing_and_ships_every_migration(built: Built) -> None:
    """setuptools warns ("Package would be ignored") of a data folder it is not told about;
    every migration file must still reach the wheel."""
    warned = [line for line in built.output.splitlines() if "WARNING" in line.upper()]
    # Byte-compiling is off where PYTHONDONTWRITEBYTECODE is set: the environment, not the project.
    assert [w for w in warned if "byte-compiling is disabled" not in w] == []
    names = set(zipfile.ZipFile(built.wheel).namelist())
    migrations = REPO / "outboxkit" / "migrations"
    files = [*migrations.glob("files/postgres/*.sql"), *migrations.glob("files/mongodb/*.json")]
    assert len(files) >= 2
    missing = [f for f in files if f"outboxkit/{f.relative_to(REPO / 'outboxkit')}" not in names]
    assert missing == []


@pytest.mark.timeout(600)
def test_wheel_installs_cleanly(built: Built, tmp_path: Path) -> None:
    wheel = built.wheel
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("outboxkit", "outboxkit/schemas", "outboxkit/relay", "outboxkit/inbox"):
        assert f"{package}/py.typed" in names
    assert "outboxkit/migrations/files/postgres/0001_init.sql" in names
    assert not [n for n in names if n.split("/")[0] in {"schemas", "relay", "inbox", "tests"}]

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # By name from the folder the wheel is in, as docs/getting-started.md installs it; from an
    # empty directory, so that nothing of the repository is importable.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    install = [str(python), "-m", "pip", "install", "-q", "--find-links", str(wheel.parent)]
    subprocess.run([*install, "outboxkit"], check=True, capture_output=True, cwd=outside)
    probe = subprocess.run(
        [str(python), "-c", PROBE], check=True, capture_output=True, text=True, cwd=outside
    )
    result = json.loads(probe.stdout)
    assert result["generic_names"] == []
    in_tree = sorted(p.stem for p in (REPO / "outboxkit/migrations/files/postgres").glob("*.sql"))
    assert result["migrations"] == in_tree, "every migration is in the wheel"
    # murmur2(b"21") is -973932308 (Kafka's UtilsTest); toPositive → 1173551340; % 16 → 12.
    assert result["partition"] == 12

    def outboxkit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        command = [str(env_dir / "bin" / "outboxkit"), *args]
        environment = {"PATH": os.environ["PATH"], **env}
        return subprocess.run(
            command, check=False, capture_output=True, text=True, cwd=outside, env=environment
        )

    version = outboxkit("--version")
    assert version.stdout.strip() == f"outboxkit {result['version']}", version.stderr

    # No database driver without its extra; a command given a URL of that database says which.
    assert result["drivers"] == []
    migrate = outboxkit("migrate", OUTBOXKIT_DATABASE_URL="postgresql://app@h/shop")
    assert migrate.returncode != 0
    assert "pip install 'outboxkit[postgresql]'" in migrate.stdout + migrate.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("extra", "url", "other"),
    [
        ("postgresql", "postgresql://app@h/shop", "pymongo"),
        ("mongodb", "mongodb://h/shop?replicaSet=rs0", "psycopg"),
    ],
)
def test_a_database_extra_installs_its_driver_and_not_the_other(
    built: Built, tmp_path: Path, extra: str, url: str, other: str
) -> None:
    """A PostgreSQL-only service installs ``outboxkit[postgresql]``, a MongoDB-only one
    ``outboxkit[mongodb]``: its backend loads, and the other database's driver is not there."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    install = [str(python), "-m", "pip", "install", "-q", "--find-links", str(built.wheel.parent)]
    subprocess.run(
        [*install, f"outboxkit[{extra}]"],
        check=True,
        capture_output=True,
        cwd=outside,
    )
    probe = (
        "import importlib.util\n"
        "from outboxkit.backends import backend_for\n"
        f"print(type(backend_for({url!r})).__name__, importlib.util.find_spec({other!r}))"
    )
    loaded = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, cwd=outside
    )
    backend = {"postgresql": "PostgresBackend", "mongodb": "MongoBackend"}[extra]
    assert loaded.stdout.split() == [backend, "None"]
