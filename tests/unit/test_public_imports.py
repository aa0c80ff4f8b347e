"""What users' code is written with uses outboxkit's public API only: the demo, the examples
and the shipped contract suite import from outboxkit (besides their own modules) only names
that a public module lists in its ``__all__``. Every other module is internal: it may change in
any release."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Each user of the public API, and the package whose own modules it may import freely.
USERS = {
    "outboxkit/demo": "outboxkit.demo",
    "examples": "examples",
    "outboxkit/testing/contract": "outboxkit.testing.contract",
}


#: The public modules: the packages and the modules the documents teach.
PUBLIC = {
    "outboxkit",
    "outboxkit.schemas",
    "outboxkit.relay",
    # what a relay storage shares with the others to tell a relay process has died
    "outboxkit.relay.presence",
    "outboxkit.inbox",
    "outboxkit.pipeline",
    # the shop's events: the models the demo, the examples and the Spark job share
    "outboxkit.demo.events",
    "outboxkit.backends",
    "outboxkit.service",
    "outboxkit.fastapi",
    "outboxkit.console",
    "outboxkit.testing",
    "outboxkit.testing.contract",
    "outboxkit.embedded",
    "outboxkit.embedded.kafka",
    "outboxkit.embedded.mongodb",
    "outboxkit.embedded.postgres",
    "outboxkit.embedded.spark_cluster",
    "outboxkit.embedded.spark_jvm",
}


def _public(module: str) -> ModuleType | None:
    return importlib.import_module(module) if module in PUBLIC else None


def _internal_names(module: str, names: list[str]) -> list[str]:
    public = _public(module)
    if public is None:
        return [f"{module} (internal module)"]
    exported = set(public.__all__)
    return [
        f"{module}.{name}"
        for name in names
        if name not in exported and _public(f"{module}.{name}") is None
    ]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every absolute import of outboxkit in ``path``."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return [(m, names) for m, names in found if m == "outboxkit" or m.startswith("outboxkit.")]


@pytest.mark.parametrize("folder", sorted(USERS))
def test_users_code_imports_only_public_names(folder: str) -> None:
    own = USERS[folder]
    violations = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for module, names in _imports(path)
        if module != own and not module.startswith(f"{own}.")
        for name in _internal_names(module, names)
    ]
    assert violations == []


def test_an_internal_import_is_found(tmp_path: Path) -> None:
    """The check above is not blind: an engine module and an unlisted name are both caught."""
    code = tmp_path / "user.py"
    code.write_text(
        "from outboxkit.relay.batches import by_depth\n"
        "from outboxkit.relay import Relay, engine, presence\n"
        "import outboxkit.core.settings\n"
    )
    found = [name for module, names in _imports(code) for name in _internal_names(module, names)]
    assert found == [
        "outboxkit.relay.batches (internal module)",
        "outboxkit.relay.engine",
        "outboxkit.core.settings (internal module)",
    ]
