"""Docs that cannot drift (#28): every fenced code block of README.md, docs/ and examples/ is
run by a test as written, or marked ``illustrative`` in its info string (tests/docs_snippets.py
says which test runs which block). A new block that no test runs and that does not say so fails
here; so does a mark that a runner would still pick up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_snippets import (
    REPO,
    RUN_ELSEWHERE,
    blocks,
    documents,
    literal_script,
    runner,
    snippets,
)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", documents(), ids=_name)
def test_every_block_is_run_or_marked_illustrative(path: Path) -> None:
    unmarked = [
        f"```{block.info} {block.code.splitlines()[0] if block.code else ''}"
        for block in blocks(path)
        if not block.illustrative and runner(path, block) is None
    ]
    assert unmarked == [], (
        f"{_name(path)}: blocks no test runs; run them (tests/docs_snippets.py) or mark them "
        "```<language> illustrative"
    )


@pytest.mark.parametrize("path", documents(), ids=_name)
def test_an_illustrative_block_is_run_by_nobody(path: Path) -> None:
    """Catches a mark that the runners do not honour: the block would run anyway."""
    marked = [b.code for b in blocks(path) if b.illustrative and b.code.strip()]
    found = snippets(path)
    run = literal_script(path) if _name(path) == "docs/getting-started.md" else ""
    run += found.code if found else ""
    assert [code for code in marked if code in run] == []


@pytest.mark.parametrize(("page", "language"), sorted(RUN_ELSEWHERE))
def test_a_block_run_elsewhere_is_read_from_its_document_by_that_test(
    page: str, language: str
) -> None:
    test = (REPO / RUN_ELSEWHERE[page, language]).read_text()
    assert page.rsplit("/", maxsplit=1)[-1] in test
    assert f"```{language}" in test
    assert [b for b in blocks(REPO / page) if b.info == language], "the block is gone"


def test_the_rule_has_blocks_of_each_kind() -> None:
    """The scan found blocks of both kinds (a regex that matched nothing would pass above)."""
    found = [(b, runner(p, b)) for p in documents() for b in blocks(p)]
    assert sum(1 for b, run in found if run is not None) >= 20
    assert sum(1 for b, _ in found if b.illustrative) >= 20
