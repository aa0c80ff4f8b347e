"""Why a Kafka client could not connect, in one line: the network, TLS or the SASL login.

aiokafka reports every failed bootstrap as ``Unable to bootstrap from [...]`` and keeps the
cause in its log. When that happens, :func:`diagnose_handshake` connects once more to each
bootstrap server, step by step as the clients do (TCP, TLS, SASL), and names the first step
that fails: nothing listening, a certificate not signed by a trusted authority, a certificate
for another host name, a refused login, a broker that closed the connection after the TLS
handshake (a listener that wants a client certificate). The password is never part of it.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from outboxkit.core.kafka_clients import connection_options
from outboxkit.core.login import refused_login
from outboxkit.core.settings import KafkaConnectionSettings


@dataclass(frozen=True)
class Handshake:
    """What failed and what to do; ``None`` ``what`` when every step worked."""

    what: str | None
    fix: str | None = None
    #: Nothing answered (no TLS or SASL verdict): the broker may be starting.
    unreachable: bool = False


_REACH_FIX = (
    "Is the broker running and reachable from here? Check OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS "
    "(the broker's advertised listeners must resolve from this host too)."
)


async def diagnose_handshake(settings: KafkaConnectionSettings, within: float) -> Handshake:
    """Connect to each bootstrap server (TCP, TLS, SASL) and name the first failure."""
    options = connection_options(settings)
    options.pop("bootstrap_servers")
    found = Handshake(None)
    for server in settings.kafka_bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            async with asyncio.timeout(within):
                conn = await create_conn(
                    host, int(port), request_timeout_ms=int(within * 1000), **options
                )
            conn.close()
            return Handshake(None)  # one server is enough for a client
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            found = _describe(settings, server, exc)
    return found


def _describe(settings: KafkaConnectionSettings, server: str, exc: BaseException) -> Handshake:
    protocol = settings.kafka_security_protocol
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or str(exc)
        if "mismatch" in reason or "hostname" in reason.lower():
            return Handshake(
                f"TLS: the certificate of Kafka at {server} is not valid for that host name "
                f"({reason})",
                "Connect by a name the broker's certificate holds (its advertised listener), or "
                "fix the certificate; OUTBOXKIT_KAFKA_SSL_CHECK_HOSTNAME=false only as a last "
                "resort.",
            )
        return Handshake(
            f"TLS: the certificate of Kafka at {server} is not trusted here ({reason})",
            "Set OUTBOXKIT_KAFKA_SSL_CA_FILE to the PEM file of the authority that signed the "
            "broker's certificate (a managed service documents which).",
        )
    if isinstance(exc, ssl.SSLError):
        return Handshake(
            f"TLS handshake with Kafka at {server} failed ({exc.reason or exc})",
            f"Is {server} a TLS listener? OUTBOXKIT_KAFKA_SECURITY_PROTOCOL is {protocol}; a "
            "PLAINTEXT or SASL_PLAINTEXT listener needs that protocol instead.",
        )
    if isinstance(exc, SaslAuthenticationFailed):
        mechanism = settings.kafka_sasl_mechanism
        return Handshake(
            refused_login(
                f"Kafka at {server}",
                settings.kafka_sasl_username,
                "OUTBOXKIT_KAFKA_SASL_USERNAME and OUTBOXKIT_KAFKA_SASL_PASSWORD, and that the "
                f"user has {mechanism} credentials (SCRAM-SHA-256 and -512 are separate)",
                f"SASL {mechanism}",
            )
        )
    if isinstance(exc, UnsupportedSaslMechanismError):
        return Handshake(
            f"SASL: Kafka at {server} does not offer {settings.kafka_sasl_mechanism}",
            "Set OUTBOXKIT_KAFKA_SASL_MECHANISM to one the listener enables.",
        )
    if isinstance(exc, KafkaConnectionError) and "closed" in str(exc) and protocol == "SSL":
        return Handshake(
            f"Kafka at {server} closed the connection right after the TLS handshake",
            "The listener probably requires a client certificate (mutual TLS): set "
            "OUTBOXKIT_KAFKA_SSL_CERT_FILE and OUTBOXKIT_KAFKA_SSL_KEY_FILE, signed by an "
            "authority the broker trusts.",
        )
    if isinstance(exc, KafkaConnectionError) and protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        return Handshake(
            f"Kafka at {server} closed the connection ({exc})",
            f"OUTBOXKIT_KAFKA_SECURITY_PROTOCOL is {protocol}: is this a TLS listener (SSL, "
            "SASL_SSL)?",
        )
    if isinstance(exc, OSError | TimeoutError | KafkaConnectionError):
        return Handshake(f"cannot reach Kafka at {server}", _REACH_FIX, unreachable=True)
    return Handshake(f"cannot connect to Kafka at {server}: {type(exc).__name__}", _REACH_FIX)
