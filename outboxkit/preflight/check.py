"""``outboxkit check``: can this configuration work? Each check says what is wrong and what to do.

Checks never raise: every failure, expected or not, becomes a
:class:`~outboxkit.backends.checks.CheckResult` with a fix. Kafka's checks are here; each
database's are its backend's (``outboxkit.backends.postgres``, ``.mongodb``), so that checking
one database never imports the other's driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from outboxkit.backends.checks import DEV_HINT, CheckResult, first_line
from outboxkit.core import kafka_clients
from outboxkit.core.kafka import missing_topics_line
from outboxkit.core.settings import ConnectionSettings
from outboxkit.preflight.kafka_handshake import diagnose_handshake
from outboxkit.preflight.kafka_permissions import principal


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
                missing_topics_line(missing, existing, servers),
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


async def run_checks(
    settings: ConnectionSettings, database: Awaitable[list[CheckResult]]
) -> list[CheckResult]:
    """``database`` (the backend's own checks, see outboxkit.backends) and Kafka's, at once."""
    db_results, kafka_results = await asyncio.gather(database, check_kafka(settings))
    return [*db_results, *kafka_results]
