"""bench/ is an ordinary client of outboxkit: its own SQL or the public API, never the relay's
private queries (loaded, rewritten or run as they are), and nothing of tests/ but the failover
harness it shares with the tests (tests/README.md, "Failover harness")."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = sorted((REPO / "bench").rglob("*.py"))


def test_bench_runs_none_of_the_products_queries() -> None:
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in BENCH
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Name | ast.alias) and "load_queries" in ast.unparse(node))
        or (isinstance(node, ast.ImportFrom) and node.module == "outboxkit.core.sql")
    ]
    assert BENCH, "bench/ was looked for"
    assert not found, (
        f"bench/ loads outboxkit's private SQL (write its own, or call the API): {found}"
    )


def test_bench_imports_nothing_of_tests_but_the_failover_harness() -> None:
    importers = {
        str(path.relative_to(REPO))
        for path in BENCH
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests"
    }
    assert importers <= {"bench/failover.py"}, importers
