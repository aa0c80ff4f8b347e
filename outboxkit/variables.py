"""Every ``OUTBOXKIT_*`` variable outboxkit reads, and the ones set that nothing reads: a typo
is named at start with the closest variable outboxkit does read (``did you mean
OUTBOXKIT_BATCH_SIZE?``), by the commands and by a service alike.

What is read: the fields of the settings objects (:data:`SETTINGS`), the environment twins of
the commands' options (:data:`COMMAND_VARIABLES`) and a few more (:data:`OTHER_VARIABLES`).
The commands' twins are listed here rather than read from the commands, so that a service
checks its environment without loading the command line; tests/unit/test_unknown_variables.py
fails when the list and the commands disagree. The configuration reference
(docs/configuration.md) is generated from the same settings objects by
:mod:`outboxkit.config_reference`.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Iterator, Mapping
from functools import cache

from pydantic_settings import BaseSettings

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import ENV_PREFIX

__all__ = [
    "COMMAND_VARIABLES",
    "OTHER_VARIABLES",
    "SETTINGS",
    "known_variables",
    "load",
    "unknown_variable_warnings",
    "unknown_variables",
    "with_typo_hints",
]

#: Every settings object, as module:name (loaded on first use); each variable is a field's name
#: with the prefix.
SETTINGS = (
    "outboxkit.core.settings:KafkaConnectionSettings",
    "outboxkit.core.settings:ConnectionSettings",
    "outboxkit.core.settings:WorkerSettings",
    "outboxkit.relay:RelaySettings",
    "outboxkit.inbox:InboxSettings",
    "outboxkit.console.settings:ConsoleSettings",
    "outboxkit.pipeline.settings:PipelineSettings",
)

#: The environment twins of the ``outboxkit`` commands' options that are no setting's field.
COMMAND_VARIABLES = frozenset(
    {
        "OUTBOXKIT_CONSOLE_HOST",
        "OUTBOXKIT_CONSOLE_PORT",
        "OUTBOXKIT_DEMO_BROKER",
        "OUTBOXKIT_DEMO_DATABASE",
        "OUTBOXKIT_DEMO_KILL_RELAY",
        "OUTBOXKIT_DEMO_ORDERS",
        "OUTBOXKIT_DEMO_RATE",
        "OUTBOXKIT_DEV_DIR",
        "OUTBOXKIT_HTTP_PORT",
        "OUTBOXKIT_LOG_FORMAT",
        "OUTBOXKIT_LOG_LEVEL",
        "OUTBOXKIT_SCHEMAS_DIR",
        "OUTBOXKIT_SCHEMAS_MODE",
    }
)

#: Variables read outside the settings objects and the commands' options (those come from the
#: objects and the commands themselves): where the embedded servers' binaries are, the pytest
#: plugin's servers, and the repository's own tests and benches.
OTHER_VARIABLES = {
    "OUTBOXKIT_MONGOD": "the mongod binary the embedded MongoDB runs (outboxkit.embedded)",
    "OUTBOXKIT_KAFKA_JARS": "the Apache Kafka jars the embedded broker runs (outboxkit.embedded)",
    "OUTBOXKIT_TEST_PG_URL": "a PostgreSQL server for the tests (outboxkit.testing)",
    "OUTBOXKIT_TEST_KAFKA": "a Kafka cluster for the tests (outboxkit.testing)",
    "OUTBOXKIT_TEST_MONGO_URL": "a MongoDB replica set for the tests (outboxkit.testing)",
    "OUTBOXKIT_BENCH_PROFILE": "the repository's relay bench: profile the relays",
    "OUTBOXKIT_FUZZ_EXAMPLES": "the repository's inbox fuzz test: how many examples",
    "OUTBOXKIT_WHOLE_EXAMPLES": "the repository's round-trip property of events: how many examples",
    "OUTBOXKIT_WHOLE_BATCHES": "the same property through the Spark decoder: batches per test",
    "OUTBOXKIT_WHOLE_MODELS": "the same property through the Spark decoder: models per batch",
}


def load(target: str) -> type[BaseSettings]:
    """The settings class ``target`` (module:name) names."""
    module, _, name = target.partition(":")
    cls: type[BaseSettings] = getattr(importlib.import_module(module), name)
    return cls


def _settings_variables() -> Iterator[str]:
    for target in SETTINGS:
        for name in load(target).model_fields:
            yield f"{ENV_PREFIX}{name.upper()}"


@cache
def known_variables() -> frozenset[str]:
    """Every ``OUTBOXKIT_*`` variable outboxkit reads."""
    return frozenset([*_settings_variables(), *COMMAND_VARIABLES, *OTHER_VARIABLES])


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Each ``OUTBOXKIT_*`` variable of ``environ`` (default: this process's) that nothing
    reads, with the known one it most resembles (``None`` when none is close): a typo'd
    variable is otherwise silently unused, its setting left at its default. Not an error:
    other tools may share the prefix."""
    names = sorted(
        n for n in (os.environ if environ is None else environ) if n.startswith(ENV_PREFIX)
    )
    known = known_variables()
    if all(name in known for name in names):
        return []
    suffixes = {name.removeprefix(ENV_PREFIX): name for name in known}
    found = []
    for name in names:
        if name in known:
            continue
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1, cutoff=0.7)
        found.append((name, suffixes[close[0]] if close else None))
    return found


def unknown_variable_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per unknown variable: ``<it> is not a variable outboxkit reads; did you mean
    <the closest known one>?``"""
    lines = []
    for name, closest in unknown_variables(environ):
        hint = f"; did you mean {closest}?" if closest else " (ignored)"
        lines.append(f"{name} is not a variable outboxkit reads{hint}")
    return lines


def with_typo_hints(
    exc: ConfigurationError, environ: Mapping[str, str] | None = None
) -> ConfigurationError:
    """``exc`` (settings that failed to load) with a line for each variable it names that an
    unknown variable of ``environ`` resembles — ``<the misspelt name> is set: did you mean
    OUTBOXKIT_DATABASE_URL?`` — since a required setting under a misspelt name is reported
    missing; ``exc`` itself when there is none."""
    message = str(exc)
    hints = [
        f"  {name} is set: did you mean {closest}?"
        for name, closest in unknown_variables(environ)
        if closest is not None and re.search(rf"\b{re.escape(closest)}\b", message)
    ]
    if not hints:
        return exc
    return type(exc)("\n".join([message, *hints]))
