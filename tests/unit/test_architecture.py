"""docs/architecture.md is the map of the repository: every file it names exists, and every
module of the foundation and of the engines is on it, so the map cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "docs" / "architecture.md"
#: The foundation and the engines: each of their modules has its place on the map.
MAPPED = ("core", "schemas", "relay", "inbox", "pipeline")
_FOLDERS = (*MAPPED, "outboxkit", "tests", "bench", "docs", "examples", "compose")
_PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(_FOLDERS)})/[\w./-]*)")


def _named_paths() -> list[str]:
    return sorted({path.rstrip(".,;:") for path in _PATH.findall(DOCUMENT.read_text())})


def test_the_architecture_names_the_files_of_each_step() -> None:
    assert len(_named_paths()) > 50, _named_paths()


@pytest.mark.parametrize("path", _named_paths())
def test_every_file_the_architecture_names_exists(path: str) -> None:
    assert (REPO / path).exists(), f"docs/architecture.md names {path}, which does not exist"


def test_every_module_of_the_foundation_and_the_engines_is_on_the_map() -> None:
    named = set(_named_paths())
    modules = [
        path.relative_to(REPO).as_posix()
        for folder in MAPPED
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in {".py", ".sql"} and path.name not in {"__init__.py", "__main__.py"}
    ]
    missing = [module for module in modules if module not in named]
    assert not missing, f"docs/architecture.md does not place {missing}"


#: ``relay/lease.py`` (`ProducerLease`: `acquire`, `drop`) — a file, then the names it holds.
_ANCHORED = re.compile(r"`((?:" + "|".join(_FOLDERS) + r")/[\w./-]+)` \(([^)]*)\)")


def _anchors() -> list[tuple[str, str]]:
    """(file, name) for each name the map says a file holds, in backticks after the file."""
    pairs = set()
    for path, names in _ANCHORED.findall(DOCUMENT.read_text()):
        for name in re.findall(r"`([A-Za-z_][\w.]*)(?:\([^`]*\))?`", names):
            pairs.add((path, name.split(".")[-1]))
    return sorted(pairs)


def test_the_map_anchors_names_in_files() -> None:
    assert len(_anchors()) > 20, _anchors()


@pytest.mark.parametrize(("path", "name"), _anchors())
def test_every_name_the_map_places_in_a_file_is_there(path: str, name: str) -> None:
    """The glossary's anchors (`relay/lease.py` (`ProducerLease`)) cannot drift from the code
    either: a renamed class or function fails here until the map follows it."""
    where = REPO / path
    files = sorted(where.rglob("*.py")) if where.is_dir() else [where]
    text = "\n".join(file.read_text() for file in files)
    assert re.search(rf"\b{re.escape(name)}\b", text), (
        f"docs/architecture.md places `{name}` in {path}, which does not define or use it"
    )


#: An internal issue reference: "(#27)", "issue #32", ": #26)". Their stories belong in the
#: history (git log, bench/results/); the code and the user docs say what holds now, and why.
_ISSUE = re.compile(r"issue #?\d+|\(#\d+\)|[:,] #\d+\)")


def test_product_code_names_no_internal_issue() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for folder in (*MAPPED, "outboxkit")
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in {".py", ".sql"} and path.is_file()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _ISSUE.search(line)
    ]
    assert found == []


#: The user docs: what a user reads to learn how it works, how to run and tune it, and what it
#: measures today.
USER_DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

#: In the docs, any "#<number>" that is not another project's ("aio-libs/aiokafka#321"), or
#: "issue 17" / "Issue #17".
_DOCS_ISSUE = re.compile(r"[Ii]ssue #?\d+|(?<![\w/&-])#\d+\b")

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:tember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
#: A measurement round told as history: a date ("2026-11-26", "26 Nov 2026", "March 2025"), a
#: numbered round ("Fourth round"), a "before and after issue …".
_DATED = re.compile(
    rf"\b20\d\d-\d\d-\d\d\b|\b\d{{1,2}} {_MONTH} 20\d\d\b|\b{_MONTH} \d{{1,2}},? 20\d\d\b"
    rf"|\b{_MONTH} 20\d\d\b|\b(?:first|second|third|fourth|fifth|sixth|last) round\b"
    r"|\bbefore and after (?:issue|#)",
    re.IGNORECASE,
)


def _lines_matching(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{number}: {match.group(0)!r} in {line.strip()[:80]}"
        for path in USER_DOCS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (match := pattern.search(line))
    ]


def test_the_patterns_find_what_they_look_for() -> None:
    assert _DOCS_ISSUE.search("the target of #31 is met") is not None
    assert _DOCS_ISSUE.search("Issue 17's case") is not None
    for other_projects in ("aio-libs/aiokafka#321", "pytest-dev/pytest-xdist#1386", "(#figures)"):
        assert _DOCS_ISSUE.search(other_projects) is None
    for dated in ("2026-11-26", "26 Nov 2026", "Fourth round (", "before and after issue #17"):
        assert _DATED.search(dated) is not None, dated
    for undated in ("ISO 8601 (`PT90S`)", "before and after a settle", "a round trip", "3 rounds"):
        assert _DATED.search(undated) is None, undated


def test_the_user_docs_name_no_internal_issue() -> None:
    """A user reads what holds, not which issue brought it: the story is in git log."""
    assert _lines_matching(_DOCS_ISSUE) == []


def test_the_user_docs_hold_no_dated_measurement_rounds() -> None:
    """A page gives today's figures and the command that reproduces them; the rounds that led
    there, dated, live in bench/results/."""
    assert _lines_matching(_DATED) == []
