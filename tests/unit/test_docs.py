"""The documentation cannot drift from the code: the configuration reference is generated from
the settings objects, and every ```python block compiles (the integration tier runs them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outboxkit.config_reference import SECTIONS, render
from outboxkit.variables import SETTINGS
from tests.docs_snippets import REPO, Snippets, all_snippets


def test_the_configuration_reference_has_a_section_per_settings_object() -> None:
    assert [target for _, target, _ in SECTIONS] == list(SETTINGS)


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    on_disk = (REPO / "docs" / "configuration.md").read_text()
    assert on_disk == render(), (
        "docs/configuration.md is stale: python -m outboxkit.config_reference "
        "> docs/configuration.md"
    )


@pytest.mark.parametrize("snippets", all_snippets(), ids=lambda s: s.name)
def test_the_snippets_compile(snippets: Snippets) -> None:
    compile(snippets.code, snippets.name, "exec")


def test_the_documents_link_to_files_that_exist() -> None:
    broken = []
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        for target in _relative_links(doc.read_text()):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.name} → {target}")
    assert not broken, broken


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slug, n = _slug(heading), 0
        while (anchor := slug if n == 0 else f"{slug}-{n}") in found:
            n += 1
        found.add(anchor)
    return found


def test_the_documents_link_to_sections_that_exist() -> None:
    """A section renamed or moved (a page's measurement history went to bench/results/) breaks
    no link: every ``page.md#section`` of README.md and docs/ names a heading of that page."""
    assert _slug("Claiming without a cursor — and without `claim` writes") == (
        "claiming-without-a-cursor--and-without-claim-writes"
    )
    broken = []
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.MULTILINE | re.DOTALL)
        for link, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            target = doc.parent / link if link else doc
            if "://" in link or target.suffix != ".md" or not target.exists():
                continue
            if anchor not in _anchors(target):
                broken.append(f"{doc.name} → {link}#{anchor}")
    assert not broken, broken


def _relative_links(text: str) -> list[Path]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # code, not links
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    return [Path(link) for link in links if "://" not in link]
