"""A login the server refuses is a misconfiguration, not an outage: ``check``, ``migrate`` and
the relay name it in one line — ``<server> refused the login for user <user>: check …`` — and a
worker exits at once instead of waiting out its start-up grace (OUTBOXKIT_STARTUP_GRACE, for a
server that does not answer). So does a service (``Outboxkit``'s lifespan under uvicorn): its
start-up fails with the same line, where its pool used to retry the login in the background for
ever. PostgreSQL with password authentication and a mongod with ``--auth`` here; Kafka's SASL
login in test_secured_kafka.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pymongo import MongoClient

from outboxkit.embedded import EmbeddedPostgres
from tests.helpers import run_cli
from tests.integration.standalone_mongod import standalone_mongod

pytestmark = pytest.mark.timeout(120)

PASSWORD = "right-horse-battery"
WRONG = "wrong-staple-7"
#: Far longer than a refused login may take: waiting it out would fail the time bound below.
GRACE = "60"
AT_ONCE = 20.0


#: A FastAPI service as docs/getting-started.md writes one: its lifespan is Outboxkit's.
SERVICE = """
from fastapi import FastAPI
from outboxkit.fastapi import health_router
from outboxkit.service import Outboxkit

kit = Outboxkit(source="urn:service:shop")
app = FastAPI(lifespan=kit.lifespan)
app.include_router(health_router(kit))
"""


def serve(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """``uvicorn shop_api:app`` of :data:`SERVICE` with ``env`` (and no other OUTBOXKIT_*
    variable), until it exits; and how long it ran."""
    (tmp_path / "shop_api.py").write_text(SERVICE)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "uvicorn", "shop_api:app", "--port", "0"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")} | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result, time.monotonic() - started


def _service_refused(tmp_path: Path, env: dict[str, str], expected: str, secret: str) -> None:
    """The service's start-up fails at once with ``expected`` in one line: no traceback, no
    line of the pool retrying, nothing at debug level, never the password."""
    result, took = serve(tmp_path, env)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert [line for line in output.splitlines() if expected in line] != [], output
    assert "the service cannot start: " in output, output
    assert "Application startup failed" in output, output
    for noise in ("Traceback", "[debug", "error connecting", "Application startup complete"):
        assert noise not in output, output
    assert secret not in output, output
    assert took < AT_ONCE, f"the service ran {took:.1f} s, as if the login could come back"


def _refused(env: dict[str, str], expected: str, secret: str) -> None:
    """Each command fails with exit code 1, ``expected`` in one line, at once."""
    for command in (["check"], ["migrate"], ["relay"]):
        started = time.monotonic()
        result = run_cli(*command, env=env)
        took = time.monotonic() - started
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        lines = [line for line in output.splitlines() if expected in line]
        assert len(lines) == 1, output
        assert "Traceback" not in output, output
        assert secret not in output, output
        assert took < AT_ONCE, f"{command}: {took:.1f} s, as if the login could come back"


@pytest.fixture(scope="module")
def password_postgresql(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PostgreSQL server whose user alice must give her password (scram-sha-256); its
    URL without a user."""
    with EmbeddedPostgres(tmp_path_factory.mktemp("pg")) as server:
        _require_password(server)
        yield server.url().replace("postgres@", "")


def _require_password(server: EmbeddedPostgres) -> None:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE alice LOGIN PASSWORD '{PASSWORD}'")
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(row[0])
        hba.write_text("host all alice 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")


@pytest.mark.parametrize(
    ("login", "reason"),
    [
        (f"alice:{WRONG}@", 'password authentication failed for user "alice"'),
        ("alice@", "fe_sendauth: no password supplied"),
    ],
)
def test_postgresql_refusing_the_login_is_named_and_not_waited_for(
    password_postgresql: str, kafka_bootstrap: str, login: str, reason: str
) -> None:
    """Catches a refused login worded as an unreachable server ("no password supplied" was
    "cannot connect … Is the server running?" on a7270d4, which the relay then waited for)."""
    url = password_postgresql.replace("postgresql://", f"postgresql://{login}")
    env = {
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_STARTUP_GRACE": GRACE,
    }
    expected = (
        "refused the login for user alice: check the user and password in "
        f"OUTBOXKIT_DATABASE_URL ({reason}"
    )
    _refused(env, expected, WRONG)


def test_a_service_whose_postgresql_refuses_the_login_fails_its_start_up(
    password_postgresql: str, tmp_path: Path
) -> None:
    """Catches a service that logged "Application startup complete" and then the pool's raw
    ``password authentication failed`` every 2 s for ever (with a debug line of its topic
    check), where the CLI workers stop at once with the fix."""
    url = password_postgresql.replace("postgresql://", f"postgresql://alice:{WRONG}@")
    expected = (
        "refused the login for user alice: check the user and password in "
        'OUTBOXKIT_DATABASE_URL (password authentication failed for user "alice")'
    )
    _service_refused(tmp_path, {"OUTBOXKIT_DATABASE_URL": url}, expected, WRONG)


def test_a_services_misspelt_setting_is_said_in_a_line_of_its_own(tmp_path: Path) -> None:
    """The "did you mean" of a misspelt variable, once at the end of uvicorn's 25-line
    traceback of the lifespan, is outboxkit's own error line, with no traceback."""
    # Spelt in two parts: the scan of the variables the repository names
    # (tests/unit/test_unknown_variables.py) takes only that test's typos as being on purpose.
    misspelt = "OUTBOXKIT_" + "DATABSE_URL"
    result, _ = serve(tmp_path, {misspelt: "postgresql://127.0.0.1:1/shop"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "the service cannot start" in line]
    assert len(lines) == 1, output
    assert f"{misspelt} is set: did you mean OUTBOXKIT_DATABASE_URL?" in output


def test_mongodb_refusing_the_login_is_named_and_not_waited_for(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Catches MongoDB's AuthenticationFailed told as "cannot connect … Is mongod running?"
    (a7270d4)."""
    with standalone_mongod(tmp_path, "--auth") as port:
        admin: MongoClient[dict[str, Any]] = MongoClient(f"127.0.0.1:{port}", directConnection=True)
        with admin:  # the localhost exception lets the first user in
            admin.admin.command("createUser", "alice", pwd=PASSWORD, roles=["root"])
        env = {
            "OUTBOXKIT_DATABASE_URL": (
                f"mongodb://alice:{WRONG}@127.0.0.1:{port}/shop?authSource=admin"
            ),
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "OUTBOXKIT_TOPICS": "orders",
            "OUTBOXKIT_STARTUP_GRACE": GRACE,
        }
        expected = (
            "MongoDB at mongodb://alice:***@127.0.0.1:"
            f"{port}/shop?authSource=admin refused the login for user alice: check the user, "
            "password and authSource in OUTBOXKIT_DATABASE_URL (Authentication failed."
        )
        _refused(env, expected, WRONG)
        _service_refused(
            tmp_path, {"OUTBOXKIT_DATABASE_URL": env["OUTBOXKIT_DATABASE_URL"]}, expected, WRONG
        )
