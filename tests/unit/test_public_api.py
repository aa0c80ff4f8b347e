"""The public API is what the documents say it is: every name they import or spell out
(``outboxkit.relay.Relay``) exists, and each exception tree drawn in an ``exceptions`` module's
docstring is the tree of its classes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from outboxkit import OutboxkitError

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").rglob("*.md")]
)
_IMPORT = re.compile(r"from (outboxkit(?:\.\w+)*) import (?:\(([\w ,\n]+)\)|([\w ,]+))")
#: A dotted name that ends in a class-like name (lower-case ones are also collections, tables
#: and consumer groups, such as outboxkit.outbox).
_DOTTED = re.compile(r"\b(outboxkit(?:\.[a-z_]\w*)*\.[A-Z]\w*)")
_TREE_LINE = re.compile(r"^[\s│├└─]*([A-Z]\w*Error)\b", re.MULTILINE)


def _documented_imports() -> list[tuple[str, str, str]]:
    found = []
    for path in DOCUMENTS:
        for module, grouped, inline in _IMPORT.findall(path.read_text()):
            for name in re.split(r"[,\s]+", grouped or inline):
                if name and name != "as":
                    found.append((path.name, module, name))
    return found


def _documented_dotted_names() -> list[tuple[str, str]]:
    return [
        (path.name, dotted) for path in DOCUMENTS for dotted in _DOTTED.findall(path.read_text())
    ]


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


@pytest.mark.parametrize(("document", "module", "name"), _documented_imports())
def test_every_documented_import_exists(document: str, module: str, name: str) -> None:
    pytest.importorskip("pyspark") if ".pipeline" in module or ".spark" in module else None
    assert hasattr(importlib.import_module(module), name), f"{document}: {module}.{name}"


def test_every_dotted_name_in_the_documents_resolves() -> None:
    missing = sorted(
        {f"{doc}: {dotted}" for doc, dotted in _documented_dotted_names() if not _resolves(dotted)}
    )
    assert not missing, missing


@pytest.mark.parametrize(
    "module", ["outboxkit.core", "outboxkit.schemas", "outboxkit.relay", "outboxkit.inbox"]
)
def test_the_exception_tree_in_the_docstring_is_the_real_one(module: str) -> None:
    exceptions = importlib.import_module(f"{module}.exceptions")
    drawn = set(_TREE_LINE.findall(exceptions.__doc__ or ""))
    defined = {
        name
        for name, value in vars(exceptions).items()
        if isinstance(value, type)
        and issubclass(value, OutboxkitError)
        and value.__module__ == exceptions.__name__
    }
    assert drawn == defined, f"drawn only: {drawn - defined}, defined only: {defined - drawn}"
