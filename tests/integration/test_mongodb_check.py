"""`outboxkit check` against a real MongoDB replica set (only when OUTBOXKIT_MONGO_URL is set)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.mongodb


def test_check_reports_the_replica_set(kafka_bootstrap: str) -> None:
    result = run_cli(
        "check",
        env={
            "OUTBOXKIT_DATABASE_URL": os.environ["OUTBOXKIT_MONGO_URL"],
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "OUTBOXKIT_TOPICS": "",
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   database    MongoDB replica set" in result.stdout
