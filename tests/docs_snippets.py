"""The code blocks of README.md, docs/ and examples/. The rule (tests/unit/test_docs_blocks.py):
every fenced block is run by a test (:func:`runner` names it) or says it is not with the word
``illustrative`` in its info string (```` ```sh illustrative ````, ```` ```text illustrative ````
for output and diagrams): an example of output, a diagram, a command that needs the reader's own
cluster, a test module of the reader's service.

Every ```python block not marked illustrative is run. A document's blocks run in order as one
program (later blocks use what earlier ones defined), in a subprocess, against the test servers.
A comment in the document says what it needs: ``<!-- snippets: topics=orders,payments -->``
creates those topics (and registers their partition counts, as ``outboxkit topics sync`` does)
and sets ``OUTBOXKIT_TOPICS``; ``<!-- snippets: spark -->`` marks the document's test ``spark``.

docs/getting-started.md is run differently, literally (:func:`literal_script`): its ```sh and
```python blocks, as written and in order, in one shell, with no hidden setup — a python block
whose first line is ``# save as NAME`` is saved to that file, any other is run with ``python``.
A few other blocks are run by the test that :data:`RUN_ELSEWHERE` names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_NEEDS = re.compile(r"<!-- snippets: (.*?) -->")
_ANY_BLOCK = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SAVE_AS = re.compile(r"# save as (\S+)\n")

#: Documents run literally, shell and python, by tests/integration/test_getting_started.py.
LITERAL_DOCUMENTS = ("docs/getting-started.md",)

#: The word of a block's info string that says no test runs it.
ILLUSTRATIVE = "illustrative"

#: Blocks run as written by a test of their own: (document, language) → that test, which reads
#: them from the document.
RUN_ELSEWHERE = {
    ("docs/security.md", "sql"): "tests/integration/test_database_grants.py",
    ("docs/testing.md", "python test_my_backend.py"): "tests/integration/test_shipped_contract.py",
    ("docs/operations.md", "sh chart"): "tests/integration/test_deploy_chart.py",
}


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
    if str(path.relative_to(REPO)) in LITERAL_DOCUMENTS:
        return None
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


@dataclass(frozen=True)
class Block:
    info: str  # the info string: the language, then tags such as "illustrative"
    code: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def illustrative(self) -> bool:
        return ILLUSTRATIVE in self.info.split()[1:]

    @property
    def saved_as(self) -> str | None:
        """The file a ``# save as NAME`` python block goes to."""
        match = _SAVE_AS.match(self.code)
        return match.group(1) if self.language == "python" and match else None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    return [Block(info.strip(), code) for info, code in _ANY_BLOCK.findall(path.read_text())]


def runner(path: Path, block: Block) -> str | None:
    """The test that runs ``block`` of ``path`` as written, or ``None``."""
    name = str(path.relative_to(REPO))
    if block.illustrative:
        return None
    if name in LITERAL_DOCUMENTS:
        is_run = block.language in ("sh", "python")
        return "tests/integration/test_getting_started.py" if is_run else None
    if block.info == "python":  # what _BLOCK finds
        return "tests/integration/test_docs_snippets.py"
    return RUN_ELSEWHERE.get((name, block.info))


def literal_script(path: Path) -> str:
    """The bash script that runs ``path``'s blocks as written, in order: ```sh blocks as they
    are, ```python blocks saved (``# save as NAME``) or run with ``python``."""
    parts = ["set -euo pipefail"]
    for index, block in enumerate(blocks(path)):
        end = f"OUTBOXKIT_BLOCK_{index}"
        if block.illustrative:
            continue
        if block.language == "sh":
            parts.append(block.code)
        elif block.language == "python" and block.saved_as:
            parts.append(f"cat > {block.saved_as} <<'{end}'\n{block.code}{end}")
        elif block.language == "python":
            parts.append(f"python - <<'{end}'\n{block.code}{end}")
    return "\n".join(parts) + "\n"
