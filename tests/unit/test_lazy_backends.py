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
        "import outboxkit.backends, outboxkit.preflight.check, outboxkit.preflight.diagnose",
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


#: The operator's tooling: the command line, the preflight checks and their Kafka permission
#: probes, the configuration reference's generator, the servers and demo of a laptop.
OPERATOR_MODULES = (
    "outboxkit.cli",
    "outboxkit.cli_options",
    "outboxkit.config_reference",
    "outboxkit.demo",
    "outboxkit.dev",
    "outboxkit.embedded",
    "outboxkit.preflight",
    "outboxkit.testing",
    "typer",
)


def _operator_modules_after(statement: str) -> list[str]:
    code = (
        f"import sys\n{statement}\n"
        f"print(','.join(sorted(m for m in sys.modules if m.startswith({OPERATOR_MODULES!r}))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return [m for m in result.stdout.strip().split(",") if m]


@pytest.mark.parametrize(
    "statement",
    [
        # A FastAPI service (the writer, a relay, an inbox) on either database.
        "import outboxkit.fastapi; from outboxkit.backends import backend_for; "
        "backend_for('postgresql://localhost/shop'); "
        "backend_for('mongodb://localhost/shop?replicaSet=rs0')",
        "from outboxkit.relay import Relay, PostgresOutbox; "
        "from outboxkit.inbox import InboxWorker, PostgresInboxStore",
    ],
)
def test_a_service_loads_none_of_the_operators_tooling(statement: str) -> None:
    """A process that writes, relays or consumes loads what it runs: the backends check their
    database with outboxkit.backends.checks' result type, never the preflight package, and the
    service names a typo'd variable with outboxkit.variables, never the command line."""
    assert _operator_modules_after(statement) == []


def test_the_operators_tooling_is_what_the_check_looks_for() -> None:
    """Guards the test above: ``outboxkit check`` loads the modules it looks for."""
    loaded = _operator_modules_after("import outboxkit.cli.migrate")
    assert {"outboxkit.preflight.check", "outboxkit.preflight.diagnose", "typer"} <= set(loaded)


@pytest.mark.parametrize("hidden", ["pytest", "pytest_asyncio"])
def test_outboxkit_testing_without_the_testing_extra_names_it(hidden: str) -> None:
    """``outboxkit.testing.schemas`` (and the plugin) failed with a bare ``No module named
    'pytest'``: nothing said that the ``[testing]`` extra brings it."""
    printed = _without((hidden,), "from outboxkit.testing.schemas import assert_compatible")
    assert printed == (
        f"ModuleNotFoundError outboxkit.testing needs the [testing] extra ({hidden} is not "
        "installed): pip install 'outboxkit[testing]'"
    )
