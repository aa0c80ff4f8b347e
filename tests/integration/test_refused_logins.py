"""A login the server refuses is a misconfiguration, not an outage: ``check``, ``migrate`` and
the relay name it in one line — ``<server> refused the login for user <user>: check …`` — and a
worker exits at once instead of waiting out its start-up grace (OUTBOXKIT_STARTUP_GRACE, for a
server that does not answer). PostgreSQL with password authentication and a mongod with
``--auth`` here; Kafka's SASL login in test_secured_kafka.py."""

from __future__ import annotations

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
