"""`outboxkit check` against real servers: says what is wrong and what to do, no traceback."""

from __future__ import annotations

import json
import re

from outboxkit.embedded._process import free_port
from tests.helpers import run_cli
from tests.integration.conftest import MakeTopic
from tests.integration.test_clock_skew import skewed


def _env(database_url: str, bootstrap: str, topics: str = "") -> dict[str, str]:
    return {
        "OUTBOXKIT_DATABASE_URL": database_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOXKIT_TOPICS": topics,
        "OUTBOXKIT_CONNECT_TIMEOUT": "5",
    }


async def test_all_good(pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = await make_topic("orders", partitions=3)
    result = run_cli("check", env=_env(pg_url, kafka_bootstrap, topic))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   database" in result.stdout
    assert "ok   migrations  schema is up to date" in result.stdout
    assert f"ok   topics      found {topic}" in result.stdout
    assert "ok   clock       this host's clock is 0.0" in result.stdout


def test_check_reports_the_clock_skew_to_the_database(db_url: str, kafka_bootstrap: str) -> None:
    """#41: `check` says how far this host's clock is from the database's, and what it still
    affects (a worker's own clock stamps only Kafka's CreateTime): here 45 s behind, under
    libfaketime."""
    result = run_cli("check", env={**_env(db_url, kafka_bootstrap), **skewed("-45s")})
    found = re.search(r"ok   clock       this host's clock is (\d+\.\d+) s behind", result.stdout)
    assert found, result.stdout + result.stderr
    assert 44 < float(found.group(1)) < 46
    assert "Kafka record timestamps (CreateTime) written here are off" in result.stdout
    assert "Synchronise this host's clock" in result.stdout


def test_unreachable_database_and_broker(pg_url: str) -> None:
    dead_pg = f"postgresql://postgres@127.0.0.1:{free_port()}/app"
    dead_kafka = f"127.0.0.1:{free_port()}"
    result = run_cli("check", env=_env(dead_pg, dead_kafka))
    assert result.returncode == 1
    assert "cannot connect to PostgreSQL at" in result.stdout
    assert f"cannot reach Kafka at {dead_kafka}" in result.stdout
    assert "OUTBOXKIT_DATABASE_URL" in result.stdout
    assert "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_password_is_not_printed(kafka_bootstrap: str) -> None:
    url = f"postgresql://app:s3cret@127.0.0.1:{free_port()}/app"
    result = run_cli("check", env=_env(url, kafka_bootstrap))
    assert "s3cret" not in result.stdout + result.stderr
    assert "app:***@" in result.stdout


def test_missing_topic_and_json_output(pg_url: str, kafka_bootstrap: str) -> None:
    result = run_cli("check", "--json", env=_env(pg_url, kafka_bootstrap, "no-such-topic"))
    assert result.returncode == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["kafka"]["ok"] is True
    assert checks["topics"]["ok"] is False
    assert "no-such-topic" in checks["topics"]["summary"]
    # One line: the topic and the command that creates it.
    assert "`outboxkit topics create no-such-topic`" in checks["topics"]["summary"]


def test_missing_migrations(empty_pg_url: str, kafka_bootstrap: str) -> None:
    result = run_cli("check", env=_env(empty_pg_url, kafka_bootstrap))
    assert result.returncode == 1
    assert "not applied: 0001_init" in result.stdout
    assert "outboxkit migrate" in result.stdout


def test_invalid_settings_exit_2(kafka_bootstrap: str) -> None:
    result = run_cli(
        "check", env={**_env("mysql://db/x", "no-port"), "OUTBOXKIT_CONNECT_TIMEOUT": "-1"}
    )
    assert result.returncode == 2
    assert "OUTBOXKIT_DATABASE_URL: unsupported scheme 'mysql'" in result.stderr
    assert "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS: 'no-port' is not host:port" in result.stderr
    assert "OUTBOXKIT_CONNECT_TIMEOUT" in result.stderr
    assert "Traceback" not in result.stderr
