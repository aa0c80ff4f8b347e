"""How the suite is spread over pytest-xdist's workers (``-n`` and ``--dist loadgroup`` in
pyproject.toml), and the order each tier runs in.

- **Costly shared fixtures stay on one worker.** Every worker starts its own PostgreSQL, Kafka
  broker and mongod (session fixtures, a second or so each), but a local SparkSession, the
  secured broker and a module's own servers cost far more, so every test that uses one runs on
  the same worker (an ``xdist_group``), which starts it once.
- **Longest first.** Unit tests still run first (README says so); then the integration tests,
  the longest first, as their last recorded durations (``tests/durations.json``) say — a
  3-minute test started last would end the run 3 minutes after every other worker. A group
  counts as the sum of its tests; a test with no record counts as :data:`UNKNOWN` seconds.
- ``pytest --record-durations`` writes ``tests/durations.json`` from that run (setup, call and
  teardown of each integration test that passed): run it after adding or slowing down tests.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")

#: Seconds a test without a recorded duration counts for: a typical integration test.
UNKNOWN = 2.0

#: Session fixtures too costly to start on every worker: fixture name → group.
ONE_WORKER_FIXTURES = {"spark": "spark-session", "secured_kafka": "secured-kafka"}

#: Fixture scopes narrower than the session but wider than a test: a module's own servers.
_SHARED_SCOPES = {"package", "module", "class"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each passed test's duration to {DURATIONS.name} (the order of later runs)",
    )


def group_of(item: pytest.Item) -> str | None:
    """The ``xdist_group`` an item must share with others, if any."""
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in ONE_WORKER_FIXTURES.items():
        if fixture in names:
            return group
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is None:
        return None
    for definitions in fixture_info.name2fixturedefs.values():
        if any(definition.scope in _SHARED_SCOPES for definition in definitions):
            return item.nodeid.split("::", 1)[0]  # the module, which defines it
    return None


def order_and_group(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Unit tests first, in their own order; then integration tests, longest group first. Adds
    the ``xdist_group`` marks."""
    groups: dict[str, str] = {}
    weight: dict[str, float] = defaultdict(float)
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        key = groups[item.nodeid] = group or item.nodeid
        weight[key] += durations.get(item.nodeid, UNKNOWN)
    first_seen = {key: index for index, key in reversed(list(enumerate(groups.values())))}

    def rank(item: pytest.Item) -> tuple[int, float, int]:
        if "tests/unit/" in item.nodeid:
            return (0, 0.0, 0)  # a stable sort keeps the unit tests' own order
        key = groups[item.nodeid]
        return (1, -weight[key], first_seen[key])

    items.sort(key=rank)


def without_group(nodeid: str) -> str:
    """A node id without the ``@group`` suffix xdist gives a grouped test's id."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def load_durations() -> dict[str, float]:
    try:
        recorded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order_and_group(items, load_durations())


class DurationRecorder:
    """Adds up each test's phases on the process that reports them (xdist's controller)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = without_group(report.nodeid)
        self.seconds[nodeid] += report.duration
        if report.failed or report.skipped:
            self.failed.add(nodeid)

    def pytest_sessionfinish(self) -> None:
        recorded = load_durations()
        for nodeid, seconds in self.seconds.items():
            if nodeid not in self.failed and "tests/unit/" not in nodeid:
                recorded[nodeid] = round(seconds, 2)
        DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    worker = hasattr(config, "workerinput")
    if config.getoption("record_durations") and not worker:
        config.pluginmanager.register(DurationRecorder(), "outboxkit-duration-recorder")
