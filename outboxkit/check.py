"""``outboxkit check``: can this configuration work? Each check says what is wrong and what to do.

Checks never raise: every failure, expected or not, becomes a :class:`CheckResult` with a fix.
Kafka's checks are here; each database's are its backend's (``outboxkit.backends.postgres``,
``.mongodb``), so that checking one database never imports the other's driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from outboxkit.core import kafka_clients
from outboxkit.core.kafka import create_command
from outboxkit.core.redact import redact
from outboxkit.core.settings import ConnectionSettings
from outboxkit.kafka_handshake import diagnose_handshake
from outboxkit.kafka_permissions import principal
from outboxkit.migrations import Migration


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    summary: str
    fix: str | None = None
    #: The server did not answer (it may be starting, restarting or failing over): a worker
    #: waits for it during its start-up grace. False for what waiting cannot fix (a refused
    #: login, a missing table, a certificate).
    unreachable: bool = False
    #: Kafka refused an operation to this principal (an ACL is missing): the other ACLs of a
    #: worker are still worth checking in the same run.
    denied: bool = False
    #: The topics Kafka would not describe to this principal (the worker's ACL probes name the
    #: READ or WRITE it needs on each instead).
    refused_topics: tuple[str, ...] = ()
    #: The exception behind a failed check, if one was raised (``--debug`` shows its
    #: traceback); not part of the result's JSON.
    error: BaseException | None = field(default=None, repr=False, compare=False)

    def as_json(self) -> dict[str, object]:
        """The result for ``outboxkit check --json``."""
        return {
            "name": self.name,
            "ok": self.ok,
            "summary": self.summary,
            "fix": self.fix,
            "unreachable": self.unreachable,
        }


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].strip()


DEV_HINT = 'on a laptop, `eval "$(outboxkit dev up)"` starts PostgreSQL and Kafka'


#: A clock this far from the database's (seconds) is worth fixing (NTP), though no guarantee
#: depends on it.
CLOCK_SKEW_WARN = 5.0


def clock_result(server: str, skew: float, round_trip: float) -> CheckResult:
    """``clock``: how far this host's wall clock is from the database server's (``skew``,
    the server's minus this host's, read at the middle of a ``round_trip``). Never a failure:
    what must agree between workers (dedupe expiry, stall checks, MongoDB positions) runs on
    the database's clock; a worker's own stamps only each record's Kafka timestamp."""
    side = "ahead of" if skew < 0 else "behind"
    summary = (
        f"this host's clock is {abs(skew):.3f} s {side} {server}'s "
        f"(±{round_trip / 2:.3f} s, the round trip's half)"
    )
    if abs(skew) < CLOCK_SKEW_WARN:
        return CheckResult("clock", True, summary)
    return CheckResult(
        "clock",
        True,
        summary + ": Kafka record timestamps (CreateTime) written here are off by as much",
        "Synchronise this host's clock (NTP, chrony).",
    )


def migrations_result(pending: list[Migration], where: str) -> CheckResult:
    """``migrations``: whether ``pending`` (of the database ``where``) leaves anything to do."""
    if not pending:
        return CheckResult("migrations", True, "schema is up to date")
    labels = ", ".join(m.label for m in pending)
    # Every migration pending (the first creates the schema): a newcomer's "not migrated yet".
    state = "does not exist" if pending[0].version == 1 else "is not up to date"
    return CheckResult(
        "migrations",
        False,
        f"outboxkit's schema {state} in {where} ({len(pending)} migration(s) not applied: "
        f"{labels})",
        "Run `outboxkit migrate` (on PostgreSQL you may apply `outboxkit migrate --sql` with "
        "your own migration tool).",
    )


async def check_kafka(
    settings: ConnectionSettings, *, topics: Sequence[str] | None = None
) -> list[CheckResult]:
    """Kafka reachable, and ``topics`` (default: ``settings.topics``) there."""
    topics = list(settings.topics if topics is None else topics)
    servers = ",".join(settings.kafka_bootstrap_servers)
    admin = kafka_clients.admin(settings, request_timeout_ms=int(settings.connect_timeout * 1000))
    try:
        async with asyncio.timeout(settings.connect_timeout):
            await admin.start()
            existing = set(await admin.list_topics())
        missing = [topic for topic in topics if topic not in existing]
        unauthorized = await _unauthorized_topics(admin, missing) if missing else []
    except Exception as exc:
        if isinstance(exc, KafkaConnectionError | TimeoutError):
            handshake = await diagnose_handshake(settings, within=settings.connect_timeout)
            if handshake.what is not None:
                return [
                    CheckResult(
                        "kafka",
                        False,
                        handshake.what,
                        handshake.fix,
                        unreachable=handshake.unreachable,
                        error=exc,
                    )
                ]
        reason = "" if isinstance(exc, KafkaConnectionError | TimeoutError) else first_line(exc)
        return [
            CheckResult(
                "kafka",
                False,
                f"cannot reach Kafka at {servers}" + (f": {reason}" if reason else ""),
                "Is the broker running and reachable from here? Check "
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS (the broker's advertised listeners must "
                f"resolve from this host too; {DEV_HINT}).",
                unreachable=not reason,
                error=exc,
            )
        ]
    finally:
        await admin.close()
    results = [CheckResult("kafka", True, f"Kafka at {servers} ({_security(settings)})")]
    if unauthorized:
        results.append(
            CheckResult(
                "topics",
                False,
                f"Kafka does not allow {principal(settings)} DESCRIBE on "
                f"{', '.join(f'Topic:{t}' for t in unauthorized)}",
                "Grant the ACLs this worker needs (docs/security.md lists them; `outboxkit acls` "
                "prints the commands; READ or WRITE imply DESCRIBE), or fix OUTBOXKIT_TOPICS.",
                denied=True,
                refused_topics=tuple(unauthorized),
            )
        )
        missing = [topic for topic in missing if topic not in unauthorized]
    if missing:
        # One line: the topics, and the command that creates them.
        results.append(
            CheckResult(
                "topics",
                False,
                f"topic(s) {', '.join(missing)} not found on Kafka at {servers}: create them with "
                f"`{create_command(missing)}`",
            )
        )
    elif topics and not unauthorized:
        results.append(CheckResult("topics", True, f"found {', '.join(topics)}"))
    return results


def _security(settings: ConnectionSettings) -> str:
    """How this client connects: the protocol, and the SASL mechanism and user if any."""
    protocol = settings.kafka_security_protocol
    if settings.kafka_sasl_mechanism is None:
        mutual = " with a client certificate" if settings.kafka_ssl_cert_file else ""
        return f"{protocol}{mutual}"
    return f"{protocol}, {settings.kafka_sasl_mechanism} as {settings.kafka_sasl_username}"


async def _unauthorized_topics(admin: AIOKafkaAdminClient, topics: list[str]) -> list[str]:
    """Of ``topics`` (absent from the listing), those Kafka refuses to describe: with an
    authorizer, a topic one may not DESCRIBE is not listed, whether or not it exists."""
    described = await admin.describe_topics(topics)
    refused = TopicAuthorizationFailedError.errno
    return [t["topic"] for t in described if t["error_code"] == refused]


async def check_memory(settings: ConnectionSettings) -> list[CheckResult]:
    return [
        CheckResult(
            "database",
            True,
            f"in-memory database {redact(settings.database_url)} (tests only: one process, not "
            "durable)",
        )
    ]


async def run_checks(
    settings: ConnectionSettings, database: Awaitable[list[CheckResult]]
) -> list[CheckResult]:
    """``database`` (the backend's own checks, see outboxkit.backends) and Kafka's, at once."""
    db_results, kafka_results = await asyncio.gather(database, check_kafka(settings))
    return [*db_results, *kafka_results]
