"""Names a package exports but imports only when first used (PEP 562 module ``__getattr__``).

The engines export their database backends this way: ``from outboxkit.relay import
PostgresOutbox`` works, and ``import outboxkit.relay`` loads neither psycopg nor pymongo
(``tests/unit/test_lazy_backends.py``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, modules: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each name of ``modules`` is looked up in the
    module it maps to, imported then."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
