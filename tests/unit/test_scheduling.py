"""The suite's order and its groups of tests that share a worker (tests/scheduling.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.scheduling import order_and_group


@dataclass
class Definition:
    scope: str


@dataclass
class FixtureInfo:
    name2fixturedefs: dict[str, list[Definition]]


@dataclass
class Item:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)
    scopes: dict[str, str] = field(default_factory=dict)
    group: str | None = None  # an explicit xdist_group mark
    marks: tuple[str, ...] = ()

    @property
    def _fixtureinfo(self) -> FixtureInfo:
        names = {name: [Definition(scope)] for name, scope in self.scopes.items()}
        return FixtureInfo(names)

    def get_closest_marker(self, name: str) -> Any:
        if name == "xdist_group":
            return pytest.mark.xdist_group(self.group).mark if self.group else None
        return getattr(pytest.mark, name).mark if name in self.marks else None


def order(items: list[Item], durations: dict[str, float]) -> list[str]:
    seen: list[Any] = list(items)
    order_and_group(seen, durations)
    return [item.nodeid.split("::")[1] for item in seen]


def test_unit_tests_run_first_in_their_order() -> None:
    """README: "unit tests, then integration tests" — pytest alone would collect tests/integration
    first (alphabetical)."""
    items = [
        Item("tests/integration/test_a.py::t1"),
        Item("tests/unit/test_b.py::t2"),
        Item("tests/integration/test_c.py::t3"),
        Item("tests/unit/test_d.py::t4"),
    ]
    assert order(items, {"tests/unit/test_d.py::t4": 9.0})[:2] == ["t2", "t4"]


def test_integration_tests_run_longest_first_and_unknown_ones_count_as_typical() -> None:
    items = [
        Item("tests/integration/test_a.py::short"),
        Item("tests/integration/test_a.py::new"),
        Item("tests/integration/test_b.py::long"),
        Item("tests/integration/test_b.py::tie"),
    ]
    durations = {
        "tests/integration/test_a.py::short": 0.5,
        "tests/integration/test_b.py::long": 90.0,
        "tests/integration/test_b.py::tie": 2.0,
    }
    # An unknown test weighs 2 s: tied with "tie", the collection order decides.
    assert order(items, durations) == ["long", "new", "tie", "short"]


def test_tests_sharing_a_costly_fixture_are_one_group_weighed_as_their_sum() -> None:
    items = [
        Item("tests/integration/test_s.py::s1", ["spark"]),
        Item("tests/integration/test_x.py::alone"),
        Item("tests/integration/test_m.py::m1", scopes={"cluster": "module"}),
        Item("tests/integration/test_s.py::s2", ["spark"]),
        Item("tests/integration/test_m.py::m2", scopes={"cluster": "module", "pg": "session"}),
        Item("tests/integration/test_y.py::plain", scopes={"pg_url": "function"}),
        Item("tests/integration/test_z.py::marked", group="by-hand"),
        Item("tests/integration/test_c.py::cluster", marks=("heavy",)),
        Item("tests/integration/test_c.py::job", marks=("spark",)),
    ]
    durations = {
        "tests/integration/test_s.py::s1": 10.0,
        "tests/integration/test_s.py::s2": 10.0,
        "tests/integration/test_x.py::alone": 15.0,
        "tests/integration/test_m.py::m1": 3.0,
        "tests/integration/test_m.py::m2": 3.0,
        "tests/integration/test_y.py::plain": 4.0,
        "tests/integration/test_z.py::marked": 1.0,
        "tests/integration/test_c.py::cluster": 1.0,
        "tests/integration/test_c.py::job": 1.0,
    }
    seen: list[Any] = list(items)
    groups = order_and_group(seen, durations)
    assert [item.nodeid.split("::")[1] for item in seen] == [
        "s1",
        "s2",
        "cluster",
        "job",
        "alone",
        "m1",
        "m2",
        "plain",
        "marked",
    ]
    assert {nodeid.split("::")[1]: group for nodeid, group in groups.items()} == {
        "s1": "heavy",
        "s2": "heavy",
        "cluster": "heavy",
        "job": "heavy",
        "m1": "tests/integration/test_m.py",
        "m2": "tests/integration/test_m.py",
        "marked": "by-hand",
    }


def test_the_recorded_durations_name_tests_that_exist(pytestconfig: pytest.Config) -> None:
    """A stale entry only costs order, but a file that names nothing real orders nothing."""
    from tests.scheduling import load_durations  # noqa: PLC0415

    recorded = load_durations()
    assert recorded, "tests/durations.json is missing: pytest --record-durations"
    modules = {nodeid.split("::")[0] for nodeid in recorded}
    root = pytestconfig.rootpath
    assert all((root / module).is_file() for module in modules), sorted(
        m for m in modules if not (root / m).is_file()
    )


def test_the_tests_of_a_group_run_on_one_xdist_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Would catch xdist's own grouping, silently off under pytest 9.2 (every worker would
    start its own SparkSession)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    pytester.makeconftest(
        """
        import os
        import pytest
        pytest_plugins = ["tests.scheduling"]

        @pytest.fixture(scope="session")
        def spark():
            return os.environ["PYTEST_XDIST_WORKER"]
        """
    )
    pytester.makepyfile(
        **{
            f"test_{name}": f"""
            def test_spark(spark, tmp_path_factory):
                (tmp_path_factory.getbasetemp().parent / "{name}").write_text(spark)

            def test_other():
                pass
            """
            for name in ("a", "b", "c", "d")
        }
    )
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "xdist")
    result.assert_outcomes(passed=8)
    # Only a worker that ran a test_spark makes its own base directory: gw0's or gw1's.
    basetemp = next(pytester.path.glob("**/popen-gw*")).parent
    workers = {(basetemp / name).read_text() for name in ("a", "b", "c", "d")}
    assert len(workers) == 1, workers
