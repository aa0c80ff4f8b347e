"""``outboxkit demo`` end to end, as a user runs it: the real command in a subprocess, its own
embedded PostgreSQL and broker. Its ``--json`` summary must show zero lost events, its exit code
must be 0, and nothing it started may outlive it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

ORDERS = 600


def run_demo(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "outboxkit", "demo", "--json", f"--orders={ORDERS}", *args],
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


def check_nothing_lost(summary: dict[str, Any]) -> None:
    assert summary["ok"] is True
    assert summary["lost"] == 0
    assert summary["orders"] == ORDERS
    # Each order's OrderPlaced, and the PaymentCaptured its payment wrote (chaining).
    assert summary["events_written"] == 2 * ORDERS
    assert summary["events_handled"] == summary["events_written"]
    assert summary["events_published"] >= summary["events_written"]
    # Every re-sent record reached an inbox and was absorbed there, not handled twice.
    assert summary["duplicates_absorbed"] == summary["duplicates_published"]
    assert summary["dead_lettered"] == 0
    assert summary["key_order_violations"] == 0
    assert summary["latency_ms"]["count"] == ORDERS - 1  # all but the warm-up order
    assert summary["relay_kills"] == 1
    assert len(summary["takeover_seconds"]) == 1
    assert "SIGKILLed" in summary["_stderr"]
    assert leftovers(summary) == []
    assert not Path(summary["workdir"]).exists()


def test_demo_on_tansu_loses_nothing_when_the_relay_is_killed() -> None:
    summary = run_demo("--kill-relay")
    check_nothing_lost(summary)
    assert summary["broker"] == "tansu"
    assert summary["transactional"] is False
    # The output says which guarantee running without transactions weakens.
    assert "OUTBOXKIT_TRANSACTIONAL=false" in summary["note"]
    assert "G4" in summary["note"]


def test_demo_on_apache_kafka_loses_nothing_when_the_relay_is_killed(kafka_jars: Path) -> None:
    summary = run_demo(
        "--kill-relay", "--broker=kafka", env={"OUTBOXKIT_KAFKA_JARS": str(kafka_jars)}
    )
    check_nothing_lost(summary)
    assert summary["broker"] == "kafka"
    assert summary["transactional"] is True
    assert summary["note"] is None


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
