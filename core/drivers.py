"""The database drivers, one install extra per database: ``outboxkit[postgresql]`` (psycopg and
its pool), ``outboxkit[mongodb]`` (pymongo). A service installs its own database's driver only,
and outboxkit imports a driver only when a URL of its database is used
(:func:`outboxkit.backends.backend_for`). A URL whose driver is not installed is refused as the
settings are read, naming the extra to install, rather than failing later on an import."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["missing_driver"]


@dataclass(frozen=True)
class _Driver:
    database: str
    name: str
    #: Its top-level import names (psycopg's pool is a distribution of its own).
    modules: tuple[str, ...]


_DRIVERS = {
    "postgresql": _Driver("PostgreSQL", "psycopg", ("psycopg", "psycopg_pool")),
    "mongodb": _Driver("MongoDB", "pymongo", ("pymongo",)),
}


def missing_driver(kind: str) -> str | None:
    """What to install when the driver of the database ``kind`` (``postgresql``, ``mongodb``)
    is missing; ``None`` when it is installed (or ``kind`` needs none). Imports nothing."""
    driver = _DRIVERS.get(kind)
    if driver is None or all(importlib.util.find_spec(m) is not None for m in driver.modules):
        return None
    return (
        f"a {driver.database} URL needs {driver.name}, which is not installed: "
        f"pip install 'outboxkit[{kind}]'"
    )
