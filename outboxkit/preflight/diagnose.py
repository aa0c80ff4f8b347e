"""Expected failures, told to a person: what failed, and what to do about it.

The ``outboxkit`` command turns every exception it expects — a database or broker it cannot
reach, a refused password, outboxkit's tables or a topic that do not exist, invalid settings —
into a :class:`Problem`: one line naming what failed, one line saying what to do, and an exit
code (``2`` for configuration, ``1`` otherwise). Only ``--debug`` (or
``OUTBOXKIT_LOG_LEVEL=debug``) shows the traceback. :func:`preflight` checks, before a worker
starts, what it will need, so that a worker never starts only to retry forever against a
database that does not exist.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from aiokafka.errors import KafkaConnectionError, KafkaError, UnknownTopicOrPartitionError

from outboxkit.backends import backend_for
from outboxkit.backends.checks import DEV_HINT, CheckResult, first_line
from outboxkit.core.exceptions import (
    ConfigurationError,
    CoordinatorNotReadyError,
    MissingTopicsError,
    OutboxkitError,
)
from outboxkit.core.kafka import AUTHORIZATION_ERRORS, COORDINATOR_ERRORS, denied
from outboxkit.core.settings import ConnectionSettings
from outboxkit.inbox.settings import InboxSettings
from outboxkit.preflight.check import check_kafka
from outboxkit.preflight.kafka_permissions import (
    missing_inbox_permissions,
    missing_relay_permissions,
    principal,
)
from outboxkit.relay.settings import RelaySettings

logger = structlog.get_logger("outboxkit")

EXIT_FAILED = 1
#: While a worker waits at start: how often it looks again, and warns.
_RETRY_EVERY = 1.0
_WAIT_LOG_EVERY = 5.0
EXIT_CONFIG = 2


@dataclass(frozen=True)
class Problem:
    """What failed (one line) and what to do (one line, or ``None``)."""

    what: str
    fix: str | None = None
    exit_code: int = EXIT_FAILED

    def lines(self) -> list[str]:
        lines = [f"error: {self.what}"]
        if self.fix:
            lines.append(f"  → {self.fix}")
        return lines


class PreflightError(OutboxkitError):
    """What a command needs is not there."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(p.what for p in problems))
        self.problems = list(problems)


def explain(exc: BaseException) -> list[Problem] | None:
    """The problems ``exc`` stands for, or ``None`` when it is not an expected failure."""
    if isinstance(exc, PreflightError):
        return exc.problems
    if isinstance(exc, MissingTopicsError):  # not a typo in a setting: a step not taken yet
        return [Problem(str(exc))]
    if isinstance(exc, ConfigurationError):
        return [Problem(str(exc), None, EXIT_CONFIG)]
    if isinstance(exc, CoordinatorNotReadyError):
        return [Problem(str(exc), _COORDINATOR_FIX)]
    cause = _root_cause(exc)
    database_error = _explain_postgres_error(cause)
    if database_error is not None:
        return [Problem(*database_error)]
    if isinstance(cause, AUTHORIZATION_ERRORS):
        return [Problem(f"Kafka does not allow this client {denied(cause)}", _ACL_FIX)]
    if isinstance(cause, UnknownTopicOrPartitionError):
        return [Problem(f"a topic does not exist on Kafka: {first_line(cause)}", _TOPIC_FIX)]
    if isinstance(cause, COORDINATOR_ERRORS):
        what = f"Kafka's coordinator of a consumer group is not ready ({type(cause).__name__})"
        return [Problem(what, _COORDINATOR_FIX)]
    if isinstance(cause, KafkaConnectionError):
        # aiokafka: "Unable to bootstrap from [('127.0.0.1', 9092, <AddressFamily…>)]"
        hosts = ",".join(f"{h}:{p}" for h, p in re.findall(r"\('([^']+)', (\d+)", str(cause)))
        where = f" at {hosts}" if hosts else f": {first_line(cause)}"
        return [Problem(f"cannot reach Kafka{where}", _KAFKA_FIX)]
    if isinstance(cause, KafkaError):
        return [Problem(f"Kafka failed: {first_line(cause)}", _KAFKA_FIX)]
    if isinstance(exc, OutboxkitError):
        return [Problem(first_line(exc))]
    if isinstance(exc, OSError):
        return [Problem(first_line(exc))]
    return None


_KAFKA_FIX = (
    "Is the broker running and reachable from here? Check OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS "
    f"({DEV_HINT})."
)
_ACL_FIX = (
    "Grant the ACLs this worker needs (docs/security.md lists them; `outboxkit acls` prints "
    "the commands)."
)
_COORDINATOR_FIX = (
    "Retry in a few seconds: a new cluster creates its offsets topic at the first request about "
    "a group, and a broker that takes a group over loads it first."
)
_TOPIC_FIX = "Create it with `outboxkit topics create <topic>`, or fix OUTBOXKIT_TOPICS."


def _root_cause(exc: BaseException) -> BaseException:
    """Through outboxkit's wrappers (e.g. StorageUnavailableError) to the driver's error."""
    seen = exc
    while isinstance(seen, OutboxkitError) and seen.__cause__ is not None:
        seen = seen.__cause__
    return seen


def _explain_postgres_error(exc: BaseException) -> tuple[str, str | None] | None:
    """What a psycopg error means and what to do, or None if ``exc`` is not one. A process that
    never loaded psycopg (a MongoDB service) cannot have raised one, and does not load it now."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    from outboxkit.backends.postgres import explain_error  # noqa: PLC0415 - see above

    return explain_error(exc)


def _problems(results: Sequence[CheckResult]) -> list[Problem]:
    return [Problem(r.summary, r.fix) for r in results if not r.ok]


async def preflight(
    settings: ConnectionSettings,
    *,
    database: bool = True,
    kafka: bool = True,
    topics: Sequence[str] = (),
    group: str | None = None,
    grace: float = 0.0,
) -> None:
    """Check what a command needs — the database reachable with outboxkit's schema up to date,
    Kafka reachable with ``topics`` and, over an authenticated connection, the ACLs of the
    worker (the relay's, or the inbox's of consumer group ``group``) — and raise
    :class:`PreflightError` with every problem.

    For ``grace`` seconds, a server that does not answer (restarting, failing over, not up
    yet) is waited for, with a warning every few seconds: a worker started during an outage
    then starts when it ends, instead of exiting into an orchestrator's crash-loop back-off.
    What waiting cannot fix (a refused login, missing tables or topics) fails at once."""
    deadline = time.monotonic() + grace
    warned_at: float | None = None
    while True:
        checks = []
        if database:
            checks.append(backend_for(settings.database_url).check(settings))
        if kafka:
            checks.append(check_kafka(settings, topics=topics))
        results = [r for group_ in await asyncio.gather(*checks) for r in group_]
        failed = [r for r in results if not r.ok]
        now = time.monotonic()
        if not failed or not all(r.unreachable for r in failed) or now >= deadline:
            break
        if warned_at is None or now - warned_at >= _WAIT_LOG_EVERY:
            warned_at = now
            logger.warning(
                "waiting for what this worker needs",
                problems=[r.summary for r in failed],
                gives_up_in=round(deadline - now),
            )
        await asyncio.sleep(min(_RETRY_EVERY, max(deadline - now, 0)))
    problems = _problems(results)
    if kafka and all(r.denied for r in failed):
        # Reachable, and at most ACLs missing: every missing one in this run, not one per run.
        missing = await permission_problems(settings, topics, group)
        kept = [r for r in results if not r.ok and not named_by(r, missing)]
        problems = [*_problems(kept), *missing]
    if problems:
        # The exception behind the first failed check, for --debug's traceback.
        raise PreflightError(problems) from next((r.error for r in failed if r.error), None)


def named_by(result: CheckResult, missing: Sequence[Problem]) -> bool:
    """``result`` is the topics Kafka would not describe, and the ACL probes named the READ or
    WRITE the worker needs on each of them (what ``outboxkit acls`` prints, not DESCRIBE)."""
    return bool(result.refused_topics) and all(
        any(p.what.endswith(f" on Topic:{topic}") for p in missing)
        for topic in result.refused_topics
    )


async def permission_problems(
    settings: ConnectionSettings, topics: Sequence[str], group: str | None
) -> list[Problem]:
    """Over an authenticated connection, the Kafka ACLs a worker lacks, one problem each
    (:mod:`outboxkit.preflight.kafka_permissions`): the relay's for :class:`RelaySettings`, the
    inbox's of consumer group ``group`` for :class:`InboxSettings` (``topics``: its topics and
    their dead-letter topics). A probe that fails otherwise is left to the worker, which meets
    the same failure and reports it."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return []
    try:
        if isinstance(settings, RelaySettings):
            missing = await missing_relay_permissions(
                settings,
                settings.group_id,
                settings.topics,
                transactional=settings.transactional,
                timeout_ms=int(settings.connect_timeout * 1000),
            )
        elif isinstance(settings, InboxSettings) and group is not None:
            sources = [t for t in topics if not t.endswith(settings.dlq_suffix)]
            dead_letters = [t for t in topics if t.endswith(settings.dlq_suffix)]
            missing = await missing_inbox_permissions(
                settings, group, sources, dead_letters, within=settings.connect_timeout
            )
        else:
            return []
    except KafkaError as exc:
        logger.warning("could not check this worker's Kafka permissions", error=repr(exc))
        return []
    who = principal(settings)
    return [
        Problem(
            f"Kafka does not allow {who} {permission}",
            _ACL_FIX,
        )
        for permission in missing
    ]
