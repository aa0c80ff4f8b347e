"""`outboxkit topics create` and `describe` against a real broker: topics and their dead-letter
topics are created once (running it again is harmless), with the partitions, replication factor
and configs asked for; describe shows them and names a missing dead-letter topic."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from outboxkit.core.kafka import admin_client
from outboxkit.core.settings import open_broker
from tests.helpers import run_cli

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def names(kafka_bootstrap: str) -> AsyncIterator[list[str]]:
    created = [f"topics-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    yield created
    async with admin_client(open_broker([kafka_bootstrap])) as admin:
        existing = set(await admin.list_topics())
        doomed = [t for n in created for t in (n, f"{n}.dlq") if t in existing]
        if doomed:
            await admin.delete_topics(doomed)


def test_create_is_idempotent_and_creates_the_dead_letter_topics(
    kafka_bootstrap: str, names: list[str]
) -> None:
    env = {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    args = ["topics", "create", *names, "--partitions", "4", "--config", "retention.ms=3600000"]
    first = run_cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    for name in names:
        assert f"created {name}: 4 partitions, replication factor 1" in first.stdout
        assert f"created {name}.dlq: 4 partitions, replication factor 1" in first.stdout

    again = run_cli(*args, "--json", env=env)
    assert again.returncode == 0, again.stderr
    states = json.loads(again.stdout)
    assert [s["created"] for s in states] == [False] * 4

    described = run_cli("topics", "describe", *names, "--json", env=env)
    assert described.returncode == 0, described.stderr
    found = {t["name"]: t for t in json.loads(described.stdout)["topics"]}
    assert set(found) == {*names, *(f"{n}.dlq" for n in names)}
    assert found[names[0]]["partitions"] == 4
    assert found[names[0]]["configs"]["retention.ms"] == "3600000"


def test_describe_names_a_missing_dead_letter_topic(kafka_bootstrap: str, names: list[str]) -> None:
    env = {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    created = run_cli("topics", "create", names[0], "--no-dlq", "--partitions", "1", env=env)
    assert created.returncode == 0, created.stderr
    assert f"{names[0]}.dlq" not in created.stdout
    described = run_cli("topics", "describe", names[0], env=env)
    assert described.returncode == 0, described.stderr
    assert f"{names[0]}: 1 partition, replication factor 1" in described.stdout  # 1 partitions
    assert f"{names[0]}.dlq: missing" in described.stdout
    assert f"`outboxkit topics create {names[0]}`" in described.stdout


def test_a_refused_spec_is_one_line_saying_why(kafka_bootstrap: str, names: list[str]) -> None:
    result = run_cli(
        "topics",
        "create",
        names[0],
        "--replication-factor",
        "3",
        env={"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    assert result.returncode == 2, result.stderr
    assert f"Kafka refused to create topic {names[0]}" in result.stderr
    assert "Traceback" not in result.stderr
