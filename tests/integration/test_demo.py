"""``outboxkit demo`` end to end, as a user runs it: the real command in a subprocess, its own
embedded database (PostgreSQL, or mongod with ``--database mongodb``) and broker. Its ``--json``
summary must show zero lost events, its exit code must be 0, and nothing it started may outlive
it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

ORDERS = 600


def run_demo(*args: str, env: dict[str, str] | None = None, orders: int = ORDERS) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "outboxkit", "demo", "--json", f"--orders={orders}", *args],
        capture_output=True,
        text=True,
        timeout=140,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    summary: dict[str, Any] = json.loads(result.stdout)
    summary["_stderr"] = result.stderr
    return summary


def leftovers(summary: dict[str, Any]) -> list[str]:
    """Processes the demo started that still run, and any process that still uses its
    directory (PostgreSQL's -D, Kafka's config)."""
    found = []
    for pid in summary["pids"]:
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z":
            found.append(f"pid {pid}")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if summary["workdir"] in cmdline:
                found.append(f"pid {proc.name}: {cmdline[:120]}")
    return found


def check_nothing_lost(summary: dict[str, Any], *, orders: int = ORDERS, kills: int = 1) -> None:
    assert summary["ok"] is True
    assert summary["lost"] == 0
    assert summary["orders"] == orders
    # Each order's OrderPlaced, and the PaymentCaptured its payment wrote (chaining).
    assert summary["events_written"] == 2 * orders
    assert summary["events_handled"] == summary["events_written"]
    assert summary["events_published"] >= summary["events_written"]
    # Every re-sent record reached an inbox and was absorbed there, not handled twice.
    assert summary["duplicates_absorbed"] == summary["duplicates_published"]
    assert summary["dead_lettered"] == 0
    assert summary["key_order_violations"] == 0
    assert summary["latency_ms"]["count"] == orders - 1  # all but the warm-up order
    assert summary["relay_kills"] == kills
    assert len(summary["takeover_seconds"]) == kills
    assert ("SIGKILLed" in summary["_stderr"]) == bool(kills)
    assert leftovers(summary) == []
    assert not Path(summary["workdir"]).exists()


def test_demo_on_tansu_loses_nothing_when_the_relay_is_killed() -> None:
    summary = run_demo("--kill-relay")
    check_nothing_lost(summary)
    assert summary["database"] == "postgresql"
    assert summary["broker"] == "tansu"
    assert summary["transactional"] is False
    # The output says which guarantee running without transactions weakens.
    assert "OUTBOXKIT_TRANSACTIONAL=false" in summary["note"]
    assert "G4" in summary["note"]
    # Read from a pipe (#28): lines up to 100 columns, not rich's 80, and no padding at their ends.
    lines = summary["_stderr"].splitlines()
    assert [line for line in lines if line != line.rstrip()] == []
    assert max(map(len, lines)) <= 100
    assert any(line.endswith("the first order was relayed, paid and confirmed") for line in lines)


def test_demo_on_apache_kafka_loses_nothing_when_the_relay_is_killed(kafka_jars: Path) -> None:
    summary = run_demo(
        "--kill-relay", "--broker=kafka", env={"OUTBOXKIT_KAFKA_JARS": str(kafka_jars)}
    )
    check_nothing_lost(summary)
    assert summary["broker"] == "kafka"
    assert summary["transactional"] is True
    assert summary["note"] is None


@pytest.mark.mongodb
def test_demo_on_mongodb_loses_nothing_when_the_relay_is_killed() -> None:
    """The same scenario on the embedded mongod: orders and their events in one multi-document
    transaction, the relay on a change stream, the inboxes' dedupe records in MongoDB."""
    summary = run_demo("--kill-relay", "--database=mongodb", env={"OUTBOXKIT_DATABASE_URL": ""})
    check_nothing_lost(summary)
    assert summary["database"] == "mongodb"
    assert summary["broker"] == "tansu"
    # mongod is SSPL-licensed and fetched, never bundled: the demo says so before running it.
    assert "SSPL" in summary["_stderr"]
    assert "MongoDB (embedded mongod)" in summary["_stderr"]
    assert "MongoDB + Tansu" in summary["_stderr"]


@pytest.mark.mongodb
def test_demo_on_a_mongodb_replica_set_of_your_own(mongo_server_url: str) -> None:
    """``OUTBOXKIT_DATABASE_URL=mongodb://…``: the demo runs on that replica set, in a database of
    its own that it drops at the end, and starts no mongod."""
    orders = 100
    url = mongo_server_url.replace("/?", "/yours?")
    summary = run_demo("--database=mongodb", env={"OUTBOXKIT_DATABASE_URL": url}, orders=orders)
    check_nothing_lost(summary, orders=orders, kills=0)
    assert "outboxkit_demo_" in summary["_stderr"]
    assert "embedded mongod" not in summary["_stderr"]
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_server_url)
    try:
        assert not [n for n in client.list_database_names() if n.startswith("outboxkit_demo_")]
    finally:
        client.close()


def test_demo_without_kafka_jars_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outboxkit", "demo", "--broker", "kafka"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUTBOXKIT_KAFKA_JARS": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "--broker kafka" in result.stderr
    # A hint that a PyPI user can follow: a command every installation has.
    assert "`outboxkit dev jars`" in result.stderr
    assert "fetch.sh" not in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_on_mongodb_without_mongod_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outboxkit", "demo", "--database", "mongodb"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "OUTBOXKIT_DATABASE_URL": "",
            "OUTBOXKIT_MONGOD": str(tmp_path / "no-mongod"),
        },
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "OUTBOXKIT_MONGOD" in result.stderr
    assert "python -m outboxkit.embedded.mongodb fetch" in result.stderr
    assert "Traceback" not in result.stderr
