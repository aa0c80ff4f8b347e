"""The demo's runner talks to its database only through the shop seam (``outboxkit.demo.shop``)
and ``outboxkit.backends``; the database code lives in ``shop_postgres`` and ``shop_mongodb``."""

from __future__ import annotations

import ast
from pathlib import Path

import outboxkit.demo

DEMO = Path(outboxkit.demo.__file__).parent
DRIVERS = {"psycopg", "psycopg_pool", "pymongo", "bson"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return names


def test_the_runner_imports_no_database_driver_nor_a_database_s_shop() -> None:
    for module in ("run.py", "relay_process.py", "summary.py"):
        imported = imported_modules(DEMO / module)
        assert not {name for name in imported if name.split(".")[0] in DRIVERS}, module
        assert not {name for name in imported if name.startswith("outboxkit.demo.shop_")}, module


def test_each_shop_keeps_to_its_database() -> None:
    postgres, mongodb = (
        imported_modules(DEMO / "shop_postgres.py"),
        imported_modules(DEMO / "shop_mongodb.py"),
    )
    assert "psycopg" in postgres
    assert not {name for name in postgres if name.split(".")[0] in {"pymongo", "bson"}}
    assert not {name for name in mongodb if name.split(".")[0] in {"psycopg", "psycopg_pool"}}
