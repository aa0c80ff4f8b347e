"""Shared test configuration: tiers, markers and the hypothesis profile.

tests/unit needs no server. tests/integration uses real servers (tests/integration/conftest.py).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, settings

from tests.gotools import HELM, PROMTOOL, GoBuildError, GoTool

# pytester runs outboxkit.testing the way a user's project does (tests/integration);
# tests.scheduling spreads the suite over the xdist workers (its docstring says how);
# tests.network.fixtures gives Toxiproxy and a broker reached through it.
pytest_plugins = ["pytester", "tests.scheduling", "tests.network.fixtures"]

settings.register_profile("default", deadline=None, max_examples=200)
settings.register_profile(
    "ci", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

_MONGO_FIXTURES = {"mongo_server_url", "mongo_factory", "mongo_replica_set_factory"}


def pytest_report_header() -> str | None:
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return None
    # Measured 2026-12-06: a relay's start 2.0 core-s instead of 0.55, the unit tier +47 %.
    return (
        "PYTHONDONTWRITEBYTECODE is set: each of the ~350 outboxkit processes the tests start "
        "compiles its modules again (unset it, as .ci/run does, for a faster run)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in item.nodeid or "tests.integration" in item.nodeid:
            item.add_marker(pytest.mark.integration)
        # `pytest -m mongodb` selects every test that uses a MongoDB server: through a fixture,
        # or as the "mongodb" case of a test parametrised over backends.
        callspec = getattr(item, "callspec", None)
        if _MONGO_FIXTURES & set(getattr(item, "fixturenames", ())) or (
            callspec is not None and "mongodb" in callspec.params.values()
        ):
            item.add_marker(pytest.mark.mongodb)


def pytest_collection_finish() -> None:
    """What importing and collecting made (modules, classes, test items: a few hundred thousand
    objects) is never garbage: frozen, so that no collection, automatic or the integration
    tests' own after each test, walks it again. A full collection of a worker's heap took
    ~50 ms after one module of integration tests, and far more with Spark loaded."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """Undo what a command run in-process (typer's ``CliRunner``) did to logging: its
    ``configure_logging`` puts the root logger on the runner's stderr, closed once the command
    returns, so every later record of the worker printed "--- Logging error ---" and a stack
    instead (the progress listener's on a py4j thread, httpx's in the network tests). pytest's
    own capture handlers come and go with each phase and are left to it. structlog's
    configuration too (a service opened in-process filters an unconfigured structlog's levels:
    a later test's ``capture_logs`` would miss its debug events)."""
    root, aiokafka = logging.getLogger(), logging.getLogger("aiokafka")
    before, levels = set(root.handlers), (root.level, aiokafka.level)
    configured, config = structlog.is_configured(), structlog.get_config()
    yield
    if (structlog.is_configured(), structlog.get_config()) != (configured, config):
        if configured:
            structlog.configure(**config)
        else:
            structlog.reset_defaults()
    for handler in root.handlers[:]:
        if handler not in before and type(handler).__module__ != "_pytest.logging":
            root.removeHandler(handler)
    root.setLevel(levels[0])
    aiokafka.setLevel(levels[1])


def _built(tool: GoTool) -> Path:
    """``tool``'s path for a test: built first if it is not cached (tests/gotools.py); a build
    that fails fails the test, saying why — never a skip."""
    try:
        return tool.path()
    except GoBuildError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def promtool() -> Path:
    return _built(PROMTOOL)


@pytest.fixture(scope="session")
def helm() -> Path:
    return _built(HELM)
