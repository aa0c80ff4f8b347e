"""outboxkit.testing.contract as a third backend uses it: docs/testing.md's block
```python test_my_backend.py, as written, in a fresh project run by pytest in a subprocess
(pytester), in pytest-asyncio's default strict mode, with warnings as errors.

Catches a shipped suite that imports from the repository's ``tests/`` (the fresh project cannot
import it), one that needs more of a backend than the page shows, tests that do not run in strict
mode (an async test not marked, an async fixture that is not a pytest_asyncio one), a property
test that no longer runs, and a page whose example went stale.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.docs_snippets import blocks

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "testing.md"
INFO = "python test_my_backend.py"

#: RelayStorageContract 18, RelayOrderContract 10 (8 depths, wide ranks, the property),
#: InboxStoreContract 7; the example declares no feature, so 3 skip.
PASSED, SKIPPED = 33, 3


def test_the_documented_backend_passes_the_shipped_suite_in_a_fresh_project(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)
    [module] = [b.code for b in blocks(PAGE) if b.info == INFO]
    pytester.makepyfile(test_my_backend=module)
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\nfilterwarnings = error\n"
    )
    result = pytester.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider", timeout=110)
    result.assert_outcomes(passed=PASSED, skipped=SKIPPED)
    result.stdout.fnmatch_lines(
        [
            "*mine: declared not to support same_key_commit_order*",
            "*mine: declared not to support outside_transaction*",
            "*mine: declared not to support presence*",
        ]
    )


def test_the_shipped_suite_imports_nothing_from_the_repositorys_tests() -> None:
    """The fresh project above would fail to import it; this names the module and the line."""
    imports = []
    for path in sorted((REPO / "outboxkit" / "testing" / "contract").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            imports += [
                f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "tests"
            ]
    assert imports == []
