"""The code blocks of README.md, docs/ and examples/: every ```python block is run by a test.

A document's blocks run in order as one program (later blocks use what earlier ones defined),
in a subprocess, against the test servers. A comment in the document says what it needs:
``<!-- snippets: topics=orders,payments -->`` creates those topics (and registers their
partition counts, as ``outboxkit topics sync`` does) and sets ``OUTBOXKIT_TOPICS``;
``<!-- snippets: spark -->`` marks the document's test ``spark``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_NEEDS = re.compile(r"<!-- snippets: (.*?) -->")


@dataclass(frozen=True)
class Snippets:
    path: Path
    code: str
    topics: tuple[str, ...]
    spark: bool = False

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO))


def documents() -> list[Path]:
    return sorted(
        [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").rglob("*.md")]
    )


def snippets(path: Path) -> Snippets | None:
    text = path.read_text()
    blocks = _BLOCK.findall(text)
    if not blocks:
        return None
    topics: tuple[str, ...] = ()
    spark = False
    for needs in _NEEDS.findall(text):
        for item in needs.split():
            key, _, value = item.partition("=")
            if key == "topics":
                topics += tuple(t for t in value.split(",") if t)
            spark |= key == "spark"
    return Snippets(path, "\n\n".join(blocks), topics, spark)


def all_snippets() -> list[Snippets]:
    return [s for s in map(snippets, documents()) if s is not None]
