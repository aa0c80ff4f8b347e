"""No source file over ~600 lines without a reason stated at its top (issue #15): a long file
is split into modules of one concern each, or says in its first lines why it is one piece
("Long on purpose: …")."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("core", "schemas", "relay", "inbox", "pipeline", "outboxkit", "tests", "bench")
LIMIT = 600
REASON = "Long on purpose:"


def _sources() -> list[Path]:
    found = {
        path.resolve()
        for folder in FOLDERS
        for pattern in ("*.py", "*.sql")
        for path in (REPO / folder).rglob(pattern)
    }
    return sorted(found)


def test_no_long_file_without_a_reason_at_its_top() -> None:
    sources = _sources()
    assert len(sources) > 100, "the source files were not found"
    unexplained = []
    for path in sources:
        lines = path.read_text().splitlines()
        if len(lines) > LIMIT and not any(REASON in line for line in lines[:15]):
            unexplained.append(f"{path.relative_to(REPO)}: {len(lines)} lines")
    assert not unexplained, f"split these, or say why at the top ({REASON!r}): {unexplained}"
