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


def _relative_links(text: str) -> list[Path]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # code, not links
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    return [Path(link) for link in links if "://" not in link]
