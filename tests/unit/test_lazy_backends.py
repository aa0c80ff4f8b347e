"""No database driver is loaded before a URL names it: a service on PostgreSQL never imports
pymongo, nor one on MongoDB psycopg. The command line, the service, the testing plugin, the relay
and inbox engines (and the in-memory backends of fast tests) import neither driver; the backends'
public names stay importable from ``outboxkit.relay`` / ``outboxkit.inbox``, loaded on first
use."""

from __future__ import annotations

import subprocess
import sys

import pytest

DRIVERS = ("psycopg", "pymongo")


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint(','.join(m for m in {DRIVERS!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return [m for m in result.stdout.strip().split(",") if m]


@pytest.mark.parametrize(
    "statement",
    [
        "import outboxkit.relay",
        "import outboxkit.inbox",
        "from outboxkit.relay import Relay, InMemoryOutbox, RelaySettings",
        "from outboxkit.inbox import Inbox, InboxWorker, InMemoryInboxStore",
    ],
)
def test_the_engines_import_no_database_driver(statement: str) -> None:
    assert _loaded_after(statement) == []


@pytest.mark.parametrize(
    ("statement", "driver"),
    [
        ("from outboxkit.relay import PostgresOutbox", "psycopg"),
        ("from outboxkit.relay import MongoOutbox", "pymongo"),
        ("from outboxkit.inbox import PostgresInboxStore", "psycopg"),
        ("from outboxkit.inbox import MongoInboxStore", "pymongo"),
    ],
)
def test_a_backend_is_loaded_when_named(statement: str, driver: str) -> None:
    assert driver in _loaded_after(statement)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import outboxkit.relay  # noqa: PLC0415

    with pytest.raises(AttributeError, match="NoSuchOutbox"):
        _ = outboxkit.relay.NoSuchOutbox  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "statement",
    [
        "import outboxkit.cli",  # every `outboxkit` command imports it before it starts
        "import outboxkit.backends, outboxkit.check, outboxkit.diagnose",
        "import outboxkit.service",
        "import outboxkit.testing",
        "from outboxkit.backends import backend_for; backend_for('memory://x')",
    ],
)
def test_the_applications_import_no_database_driver(statement: str) -> None:
    assert _loaded_after(statement) == []


@pytest.mark.parametrize(
    ("url", "loaded"),
    [
        ("postgresql://localhost/db", ["psycopg"]),
        ("mongodb://localhost/db?replicaSet=rs0", ["pymongo"]),
    ],
)
def test_a_url_loads_its_own_driver_and_not_the_other(url: str, loaded: list[str]) -> None:
    statement = f"from outboxkit.backends import backend_for; backend_for({url!r})"
    assert _loaded_after(statement) == loaded


#: Run with ``driver`` not installed (``sys.modules[name] = None``: found by neither
#: ``importlib.util.find_spec`` nor ``import``), then ``statement``; prints the error, if any.
_WITHOUT = """
import sys
for name in {modules!r}:
    sys.modules[name] = None
try:
    {statement}
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("ok")
"""

PG_URL = "postgresql://app@localhost/shop"
MONGO_URL = "mongodb://localhost/shop?replicaSet=rs0"


def _without(modules: tuple[str, ...], statement: str) -> str:
    code = _WITHOUT.format(modules=modules, statement=statement)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("hidden", "url", "extra"),
    [
        (("psycopg", "psycopg_pool"), PG_URL, "postgresql"),
        (("psycopg_pool",), PG_URL, "postgresql"),
        (("pymongo",), MONGO_URL, "mongodb"),
    ],
)
@pytest.mark.parametrize(
    "statement",
    [
        "from outboxkit.core.settings import load_settings, ConnectionSettings; "
        "load_settings(ConnectionSettings, database_url={url!r})",
        "from outboxkit.backends import backend_for; backend_for({url!r})",
    ],
)
def test_a_url_whose_driver_is_not_installed_names_the_extra(
    hidden: tuple[str, ...], url: str, extra: str, statement: str
) -> None:
    """``pyproject.toml``'s ``[postgresql]`` and ``[mongodb]`` extras: the settings refuse the
    URL, and so does :func:`backend_for` for a caller without settings."""
    printed = _without(hidden, statement.format(url=url))
    assert printed.startswith("ConfigurationError"), printed
    assert f"pip install 'outboxkit[{extra}]'" in printed, printed


@pytest.mark.parametrize(
    ("hidden", "url"), [(("psycopg", "psycopg_pool"), MONGO_URL), (("pymongo",), PG_URL)]
)
def test_the_other_databases_driver_is_not_needed(hidden: tuple[str, ...], url: str) -> None:
    statement = f"from outboxkit.backends import backend_for; backend_for({url!r})"
    assert _without(hidden, statement) == "ok"
