"""Where the suite's CPU goes, test by test: ``pytest -p tests.cpu_report --cpu-report=DIR``
writes one JSON line per test (``DIR/<worker>.jsonl``); ``python -m tests.cpu_report DIR`` sums
them by module and lists the costliest tests.

The suite is CPU-bound on two cores (tests/README.md), so CPU, not wall time, is what a cut saves.
A test's CPU is counted on its worker's process tree, from the start of its setup to the end of
its teardown: the worker itself, the processes it started and waited for (``outboxkit`` CLI runs,
relays, spark-submit) and the servers it keeps running (Kafka, mongod, PostgreSQL, the Spark
JVM), whose CPU during the test is charged to the test. A session server's start is charged to
the first test that asks for it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="DIR",
        help="write each test's CPU (its worker's process tree) to DIR/<worker>.jsonl",
    )


def _descendants_cpu(root: int) -> float:
    """CPU seconds of the live processes under ``root`` (not ``root`` itself), from /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        pid = int(entry.name)
        children[int(fields[1])].append(pid)
        # utime, stime, and the waited-for children's cutime, cstime
        cpu[pid] = sum(int(f) for f in fields[11:15]) / _TICKS
    total, todo = 0.0, list(children[root])
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children[pid])
    return total


def _tree_cpu() -> float:
    own = os.times()
    return (own.user + own.system + own.children_user + own.children_system) + _descendants_cpu(
        os.getpid()
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None]:
    directory = item.config.getoption("--cpu-report")
    if not directory:
        yield
        return
    wall, cpu = time.monotonic(), _tree_cpu()
    yield
    line = {
        "test": item.nodeid,
        "wall": round(time.monotonic() - wall, 3),
        "cpu": round(_tree_cpu() - cpu, 3),
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(directory).mkdir(parents=True, exist_ok=True)
    with Path(directory, f"{worker}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


def summarize(directory: Path, top: int = 40) -> str:
    tests = [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for test in tests:
        module = modules[test["test"].split("::")[0]]
        module[0] += test["cpu"]
        module[1] += test["wall"]
        module[2] += 1
    lines = [
        f"{len(tests)} tests: {sum(t['cpu'] for t in tests):,.0f} core-s, "
        f"{sum(t['wall'] for t in tests):,.0f} s of test time",
        "",
        "| module | tests | core-s | wall s |",
        "| --- | --- | --- | --- |",
    ]
    for name, (cpu, wall, count) in sorted(modules.items(), key=lambda m: -m[1][0])[:top]:
        lines.append(f"| `{name}` | {count} | {cpu:,.0f} | {wall:,.0f} |")
    lines += ["", "| test | core-s | wall s |", "| --- | --- | --- |"]
    for test in sorted(tests, key=lambda t: -t["cpu"])[:top]:
        lines.append(f"| `{test['test']}` | {test['cpu']:,.1f} | {test['wall']:,.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1])))
