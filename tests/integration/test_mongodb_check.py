"""`outboxkit check` against a real MongoDB replica set (the embedded mongod, or
OUTBOXKIT_TEST_MONGO_URL)."""

from __future__ import annotations

from tests.helpers import run_cli


def test_check_reports_the_replica_set(mongo_url: str, kafka_bootstrap: str) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": mongo_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "",
    }
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    result = run_cli("check", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   database    MongoDB replica set" in result.stdout
