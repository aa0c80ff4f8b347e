"""How the suite is spread over pytest-xdist's workers (``--numprocesses`` in pyproject.toml),
and the order each tier runs in.

- **Costly shared fixtures stay on one worker.** Every worker starts its own PostgreSQL, Kafka
  broker and mongod (session fixtures, a second or so each), but a local SparkSession, the
  secured broker and a module's own servers cost far more, so every test that uses one runs on
  the same worker, which starts it once; every Spark test and every ``heavy`` one (the failover
  tests) runs on one worker too, one at a time. The workers
  name each test's group (:func:`group_of`) in a file the controller's
  :class:`GroupScheduling` reads: xdist's own ``--dist loadgroup`` passes groups by rewriting
  node ids, which pytest 9.2 no longer honours (pytest-dev/pytest-xdist#1386: every group is
  silently spread over every worker).
- **Longest first.** Unit tests still run first (README says so); then the integration tests,
  the longest first, as their last recorded durations (``tests/durations.json``) say — a
  3-minute test started last would end the run 3 minutes after every other worker. A group
  counts as the sum of its tests; a test with no record counts as :data:`UNKNOWN` seconds.
- ``pytest --record-durations`` writes ``tests/durations.json`` from that run (setup, call and
  teardown of each integration test that passed): run it after adding or slowing down tests.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS = Path(__file__).with_name("durations.json")

#: Seconds a test without a recorded duration counts for: a typical integration test.
UNKNOWN = 2.0

#: Every test marked ``spark`` or ``heavy``, run one after the other on one worker. The Spark
#: tests share one local SparkSession (some ask for it only at the end); the ``heavy`` ones
#: (brokers and replica set members killed under a steady load, each fault's delay measured
#: against a bound) start three-node clusters. Their JVMs and servers are the suite's heaviest
#: CPU users: two of them at once on two cores slow each other past their bounds (a group
#: coordinator's failover measured 34 s beside the Spark cluster's tests, 6 s alone or beside
#: two busy cores).
HEAVY_GROUP = "heavy"

#: Session fixtures too costly to start on every worker: fixture name → group.
ONE_WORKER_FIXTURES = {"spark": HEAVY_GROUP, "secured_kafka": "secured-kafka"}

#: Fixture scopes narrower than the session but wider than a test: a module's own servers.
_SHARED_SCOPES = {"package", "module", "class"}

#: The key of xdist's ``workerinput`` that names the file of groups.
_GROUPS_FILE = "outboxkit_groups_file"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each passed test's duration to {DURATIONS.name} (the order of later runs)",
    )


def group_of(item: pytest.Item) -> str | None:
    """The group of tests an item must share a worker with, if any: an explicit
    ``xdist_group`` mark, a costly session fixture, or its module's own fixture."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if item.get_closest_marker("spark") or item.get_closest_marker("heavy"):
        return HEAVY_GROUP
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


def order_and_group(items: list[pytest.Item], durations: dict[str, float]) -> dict[str, str]:
    """Unit tests first, in their own order; then integration tests, longest group first.
    Returns the group of each item that has one, by node id."""
    groups: dict[str, str] = {}
    keys: dict[str, str] = {}
    weight: dict[str, float] = defaultdict(float)
    for item in items:
        group = group_of(item)
        if group is not None:
            groups[item.nodeid] = group
        key = keys[item.nodeid] = group or item.nodeid
        weight[key] += durations.get(item.nodeid, UNKNOWN)
    first_seen = {key: index for index, key in reversed(list(enumerate(keys.values())))}

    def rank(item: pytest.Item) -> tuple[int, float, int]:
        if "tests/unit/" in item.nodeid:
            return (0, 0.0, 0)  # a stable sort keeps the unit tests' own order
        key = keys[item.nodeid]
        return (1, -weight[key], first_seen[key])

    items.sort(key=rank)
    return groups


def load_durations() -> dict[str, float]:
    try:
        recorded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = order_and_group(items, load_durations())
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput and _GROUPS_FILE in workerinput:
        # Every worker collects the same tests and writes the same groups: replace atomically.
        path = Path(workerinput[_GROUPS_FILE])
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(groups))
        partial.replace(path)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scheduling by scope (a scope's tests go to one worker, scopes in collection
    order), with each test's scope its group, else itself."""

    def __init__(self, config: pytest.Config, log: Any, groups_file: Path) -> None:
        super().__init__(config, log)
        self.groups_file = groups_file

    @functools.cached_property
    def groups(self) -> dict[str, str]:
        # Read at the first scheduling, which xdist does once every worker has collected.
        groups: dict[str, str] = json.loads(self.groups_file.read_text())
        return groups

    def _split_scope(self, nodeid: str) -> str:
        return self.groups.get(nodeid, nodeid)


class XdistController:
    """The controller's part: a file for the workers' groups, and the scheduler that reads it."""

    def __init__(self) -> None:
        self.groups_file = Path(tempfile.mkdtemp(prefix="outboxkit-groups-")) / "groups.json"

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[_GROUPS_FILE] = str(self.groups_file)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":
            return None
        return GroupScheduling(config, log, self.groups_file)

    def pytest_unconfigure(self) -> None:
        self.groups_file.unlink(missing_ok=True)
        self.groups_file.parent.rmdir()


class DurationRecorder:
    """Adds up each test's phases on the process that reports them (xdist's controller)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        if report.failed or report.skipped:
            self.failed.add(report.nodeid)

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
    if config.pluginmanager.hasplugin("xdist") and not worker:
        config.pluginmanager.register(XdistController(), "outboxkit-xdist-controller")
