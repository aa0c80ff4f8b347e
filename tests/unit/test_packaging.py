"""The public API and the package list stay what they claim to be."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from outboxkit import OutboxkitError

REPO = Path(__file__).resolve().parents[2]
PUBLIC_PACKAGES = [
    "outboxkit",
    "outboxkit.core",
    "outboxkit.schemas",
    "outboxkit.relay",
    "outboxkit.inbox",
    "outboxkit.pipeline",
]


def _pyproject() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize("name", PUBLIC_PACKAGES)
def test_all_is_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not alphabetical"
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names missing {attr}"
    public = {a for a in vars(module) if not a.startswith("_")} - {"annotations"}
    submodules = {a for a in public if type(getattr(module, a)).__name__ == "module"}
    assert public - submodules <= set(exported), f"{name} exports names outside __all__"


def test_every_python_package_is_listed_for_the_wheel() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]  # type: ignore[index]
    listed = set(setuptools["packages"])  # type: ignore[index]
    mapping: dict[str, str] = setuptools["package-dir"]  # type: ignore[index]
    found = set()
    for import_name, folder in mapping.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root)
            if any(part in mapping.values() for part in relative.parts[:1]):
                continue  # the symlinks in outboxkit/ are listed under their own name
            found.add(".".join([import_name, *relative.parts]))
    assert found == listed


@pytest.mark.parametrize("folder", ["core", "schemas", "relay", "inbox", "pipeline"])
def test_each_package_is_typed_and_has_one_exceptions_module(folder: str) -> None:
    assert (REPO / folder / "py.typed").exists()
    assert (REPO / folder / "exceptions.py").exists()


def test_every_error_derives_from_the_root_and_has_a_default_message() -> None:
    for name in PUBLIC_PACKAGES[1:]:  # the root re-exports outboxkit.core's
        module = importlib.import_module(f"{name}.exceptions")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Exception):
                assert issubclass(value, OutboxkitError), value
                assert value.__doc__, f"{value} needs a docstring: it is the default message"
