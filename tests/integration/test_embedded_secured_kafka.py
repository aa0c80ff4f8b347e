"""The embedded Kafka's secured mode (outboxkit/embedded/kafka_security.py), proven with plain
aiokafka 0.14 clients and no outboxkit client code: SASL_SSL with SCRAM and PLAIN, mutual TLS,
host-name verification, and ACLs enforced by KRaft's StandardAuthorizer (Apache Kafka 4.4).

How each failure surfaces in aiokafka 0.14 (what the tests below assert):

Connecting. ``start()`` of a producer, consumer or admin client raises only
``aiokafka.errors.KafkaConnectionError("Unable to bootstrap from [...]")``, whatever went wrong.
The cause is what ``aiokafka.conn.create_conn`` raises for that address, which aiokafka also
logs (logger ``aiokafka``, ERROR, ``Unable connect to "host:port": <cause>``, the cause being the
record's last argument):

- wrong password, or a user the broker does not know: ``aiokafka.errors.SaslAuthenticationFailed``
  (error 58), "Authentication failed during authentication due to invalid credentials with SASL
  mechanism SCRAM-SHA-512"; with PLAIN, "Authentication failed: Invalid username or password";
- a CA the client does not trust: ``ssl.SSLCertVerificationError``, ``verify_message`` "unable to
  get local issuer certificate";
- a certificate for another host: ``ssl.SSLCertVerificationError``, ``verify_message`` "IP
  address mismatch, certificate is not valid for '127.0.0.1'." (for a DNS name: "Hostname
  mismatch, …");
- no client certificate on a listener that requires one: ``KafkaConnectionError("Connection at
  127.0.0.1:<port> closed")`` — under TLS 1.3 the client's handshake completes and the broker
  closes the connection after checking it.

Authorizing. These reach the caller as themselves (all ``BrokerResponseError`` subclasses):

- produce to a topic without WRITE on it: ``TopicAuthorizationFailedError``, ``args == (topic,)``
  (``str()``: "[Error 29] TopicAuthorizationFailedError: <topic>"), from ``send``/``send_and_wait``;
- consume a topic without READ (or DESCRIBE) on it: ``TopicAuthorizationFailedError`` from the
  consumer's ``start()`` (the subscription's metadata); with READ on the topic but not on the
  group: ``GroupAuthorizationFailedError``, ``args == (group,)``, also from ``start()`` (which,
  for topics given to the constructor, waits for the group's assignment);
- a transactional producer without WRITE on its transactional id:
  ``TransactionalIdAuthorizationFailed``, ``args == (transactional_id,)``, from ``start()``;
- an idempotent producer (aiokafka's default is not idempotent) of a principal with neither
  IDEMPOTENT_WRITE on the cluster nor WRITE on any topic: ``ClusterAuthorizationFailedError``,
  from ``start()``. Since Kafka 3.0 (KIP-679) WRITE on any topic implies IDEMPOTENT_WRITE, and a
  transactional producer needs only WRITE on its transactional id and topics: IDEMPOTENT_WRITE
  is harmless to grant but not needed. WRITE and READ imply DESCRIBE.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import ssl
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.helpers import create_ssl_context

from outboxkit.embedded.kafka_security import (
    CLUSTER_RESOURCE,
    SecuredKafkaCluster,
    mtls_principal,
)
from tests.helpers import wait_for
from tests.integration.conftest import MakeTopic

pytestmark = pytest.mark.integration


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _alice(kafka: SecuredKafkaCluster, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
    """aiokafka options for the SCRAM/PLAIN user alice, spelled out."""
    return {
        "bootstrap_servers": kafka.sasl_ssl_bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(kafka.ca_file)),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": kafka.users["alice"],
    }


def _mtls(kafka: SecuredKafkaCluster, client: str) -> dict[str, Any]:
    """aiokafka options for a client that authenticates with its certificate, spelled out."""
    cert, key = kafka.client_cert(client)
    return {
        "bootstrap_servers": kafka.mtls_bootstrap,
        "security_protocol": "SSL",
        "ssl_context": create_ssl_context(
            cafile=str(kafka.ca_file), certfile=str(cert), keyfile=str(key)
        ),
    }


async def _produce(topic: str, options: dict[str, Any], value: bytes = b"hello") -> None:
    producer = AIOKafkaProducer(acks="all", **options)
    try:
        await producer.start()
        await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()


async def _consume_one(topic: str, options: dict[str, Any], group: str | None = None) -> bytes:
    consumer = AIOKafkaConsumer(
        topic,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        **options,
    )
    try:
        await consumer.start()
        async with asyncio.timeout(20):
            record = await consumer.getone()
        if group is not None:
            await consumer.commit()
    finally:
        await consumer.stop()
    assert record.value is not None
    return record.value


async def _start(options: dict[str, Any]) -> None:
    """Start and stop a producer: bootstrap, authenticate, and (if asked) InitProducerId."""
    producer = AIOKafkaProducer(**options)
    try:
        await producer.start()
    finally:
        await producer.stop()


async def _cause(options: dict[str, Any]) -> BaseException:
    """What ``aiokafka.conn.create_conn`` raises for the first bootstrap address: the cause
    behind ``start()``'s KafkaConnectionError."""
    host, port = options["bootstrap_servers"].split(",")[0].rsplit(":", 1)
    settings = {k: v for k, v in options.items() if k != "bootstrap_servers"}
    try:
        conn = await create_conn(host, int(port), **settings)
    except Exception as exc:  # the type is what the caller checks
        return exc
    conn.close()
    pytest.fail(f"connected to {host}:{port}")


def _logged_cause(caplog: pytest.LogCaptureFixture) -> BaseException:
    """The cause aiokafka logged when its bootstrap failed."""
    causes = [
        record.args[-1]
        for record in caplog.records
        if record.name == "aiokafka"
        and str(record.msg).startswith("Unable connect to")
        and isinstance(record.args, tuple)
        and isinstance(record.args[-1], BaseException)
    ]
    assert causes, "aiokafka logged no connection failure"
    return causes[-1]


async def _refused(options: dict[str, Any], caplog: pytest.LogCaptureFixture) -> BaseException:
    """Assert that start() fails to bootstrap; return the cause create_conn gives (checking that
    aiokafka logged the same kind of cause)."""
    caplog.set_level(logging.ERROR, logger="aiokafka")
    sockets_before = _open_sockets()
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap from"):
        await _start(options)
    logged = _logged_cause(caplog)
    cause = await _cause(options)
    assert type(logged) is type(cause)
    _collect_failed_handshakes(caplog, cause)
    # aiokafka closes a refused connection without waiting for its socket to close: under TLS
    # the close is a close_notify and a round trip to the broker. A test that ended first would
    # close its event loop on the open transport, and collect_leaks would report it (1 test in
    # 30 here, when the test returned at once; once in CI, under load).
    await wait_for(
        lambda: not _open_sockets() - sockets_before,
        what="the refused connections' sockets to close",
    )
    return cause


def _open_sockets() -> set[str]:
    """This process's open sockets, by inode (Linux: ``/proc/self/fd``)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                sockets.add(target)
    return sockets


def _collect_failed_handshakes(caplog: pytest.LogCaptureFixture, cause: BaseException) -> None:
    """asyncio may leave the socket of a TLS handshake that failed unclosed (python/cpython#90476
    and kin; now and then): the failures' tracebacks, held by aiokafka's log records and by
    ``cause``, keep its transport until the end of the test, and ResourceWarning fires when the
    garbage collection after the test (``collect_leaks``) finds it. The tracebacks dropped, that
    runtime leak is collected here, silently; a leak of the test's own is still reported."""
    logged = [r.args[-1] for r in caplog.records if isinstance(r.args, tuple) and r.args]
    for failure in [cause, *logged]:
        chained: object = failure
        while isinstance(chained, BaseException):
            chained.__traceback__ = None
            chained = chained.__cause__ or chained.__context__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


# --- authenticating ------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
async def test_sasl_ssl_client_produces_and_consumes(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic, mechanism: str
) -> None:
    topic = await make_secured_topic("sasl")
    group = _unique("g")
    await secured_kafka.grant("User:alice", "TOPIC", topic, ["WRITE", "READ", "DESCRIBE"])
    await secured_kafka.grant("User:alice", "GROUP", group, ["READ"])
    options = _alice(secured_kafka, mechanism)
    await _produce(topic, options)
    assert await _consume_one(topic, options, group) == b"hello"


async def test_mutual_tls_client_produces_and_consumes(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic
) -> None:
    topic = await make_secured_topic("mtls")
    client, group = _unique("relay"), _unique("g")
    assert mtls_principal(client) == f"User:CN={client}"
    await secured_kafka.grant(mtls_principal(client), "TOPIC", topic, ["WRITE", "READ"])
    await secured_kafka.grant(mtls_principal(client), "GROUP", group, ["READ"])
    options = _mtls(secured_kafka, client)
    await _produce(topic, options)
    assert await _consume_one(topic, options, group) == b"hello"


async def test_scram_user_added_at_run_time_authenticates(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic
) -> None:
    topic = await make_secured_topic("carol")
    user = _unique("carol")
    await secured_kafka.add_scram_user(user, "carol-secret", "SCRAM-SHA-256")
    await secured_kafka.grant(f"User:{user}", "TOPIC", topic, ["WRITE"])
    await _produce(topic, secured_kafka.sasl_options(user, mechanism="SCRAM-SHA-256"))
    assert await _consume_one(topic, secured_kafka.sasl_options()) == b"hello"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
async def test_wrong_password_fails_authentication(
    secured_kafka: SecuredKafkaCluster, caplog: pytest.LogCaptureFixture, mechanism: str
) -> None:
    options = {**_alice(secured_kafka, mechanism), "sasl_plain_password": "not-the-password"}
    cause = await _refused(options, caplog)
    assert isinstance(cause, SaslAuthenticationFailed)
    expected = "invalid credentials" if mechanism.startswith("SCRAM") else "Invalid username"
    assert expected in str(cause)


async def test_unknown_user_fails_authentication(
    secured_kafka: SecuredKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    options = {**_alice(secured_kafka), "sasl_plain_username": _unique("nobody")}
    assert isinstance(await _refused(options, caplog), SaslAuthenticationFailed)


async def test_untrusted_ca_fails_certificate_verification(
    secured_kafka: SecuredKafkaCluster, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    options = {**_alice(secured_kafka), "ssl_context": create_ssl_context(cafile=str(other_ca))}
    cause = await _refused(options, caplog)
    assert isinstance(cause, ssl.SSLCertVerificationError)
    assert cause.verify_message == "unable to get local issuer certificate"


async def test_certificate_for_another_host_fails_hostname_verification(
    secured_kafka: SecuredKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    options = {**_alice(secured_kafka), "bootstrap_servers": secured_kafka.wrong_host_bootstrap}
    cause = await _refused(options, caplog)
    assert isinstance(cause, ssl.SSLCertVerificationError)
    assert "IP address mismatch" in cause.verify_message
    # Only the host name is wrong: the same certificate passes without the check.
    lenient = create_ssl_context(cafile=str(secured_kafka.ca_file))
    lenient.check_hostname = False
    await _start({**options, "ssl_context": lenient})


async def test_mutual_tls_listener_refuses_a_client_without_certificate(
    secured_kafka: SecuredKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    options = {
        "bootstrap_servers": secured_kafka.mtls_bootstrap,
        "security_protocol": "SSL",
        "ssl_context": create_ssl_context(cafile=str(secured_kafka.ca_file)),
    }
    cause = await _refused(options, caplog)
    assert isinstance(cause, KafkaConnectionError)
    assert "closed" in str(cause)


# --- authorizing ---------------------------------------------------------------------------


async def test_produce_needs_an_acl_on_the_topic(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic
) -> None:
    topic = await make_secured_topic("acl")
    options = _alice(secured_kafka)
    with pytest.raises(TopicAuthorizationFailedError) as refused:
        await _produce(topic, options)
    assert refused.value.args == (topic,)
    await secured_kafka.grant("User:alice", "TOPIC", topic, ["WRITE", "DESCRIBE"])
    await _produce(topic, options)  # at once: grant() returns once the broker enforces it


async def test_consumer_needs_read_on_its_topic_and_group(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic
) -> None:
    topic = await make_secured_topic("consume")
    await _produce(topic, secured_kafka.sasl_options())
    client, group = _unique("inbox"), _unique("g")
    principal = mtls_principal(client)
    consumer = AIOKafkaConsumer(
        topic, group_id=group, auto_offset_reset="earliest", **_mtls(secured_kafka, client)
    )
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await consumer.start()  # the subscription's metadata
    finally:
        await consumer.stop()

    await secured_kafka.grant(principal, "TOPIC", topic, ["READ"])
    consumer = AIOKafkaConsumer(
        topic, group_id=group, auto_offset_reset="earliest", **_mtls(secured_kafka, client)
    )
    try:
        with pytest.raises(GroupAuthorizationFailedError) as refused:
            await consumer.start()  # joining the group
    finally:
        await consumer.stop()
    assert refused.value.args == (group,)

    await secured_kafka.grant(principal, "GROUP", group, ["READ"])
    assert await _consume_one(topic, _mtls(secured_kafka, client), group) == b"hello"


async def test_transactional_producer_with_least_privilege(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic
) -> None:
    """Exactly: WRITE/DESCRIBE on the topic, IDEMPOTENT_WRITE on the cluster, WRITE/DESCRIBE on
    the transactional ids of a prefix."""
    topic = await make_secured_topic("txn")
    client, prefix = _unique("relay"), _unique("relay-tx") + "-"
    principal = mtls_principal(client)
    await secured_kafka.grant(principal, "TOPIC", topic, ["WRITE", "DESCRIBE"])
    options = {**_mtls(secured_kafka, client), "transactional_id": f"{prefix}0"}
    with pytest.raises(TransactionalIdAuthorizationFailed) as refused:
        await _start(options)
    assert refused.value.args == (f"{prefix}0",)

    await secured_kafka.grant(principal, "CLUSTER", CLUSTER_RESOURCE, ["IDEMPOTENT_WRITE"])
    await secured_kafka.grant(
        principal, "TRANSACTIONAL_ID", prefix, ["WRITE", "DESCRIBE"], pattern="PREFIXED"
    )
    producer = AIOKafkaProducer(**options)
    try:
        await producer.start()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed", key=b"k")
    finally:
        await producer.stop()
    assert await _consume_one(topic, secured_kafka.sasl_options()) == b"committed"


async def test_idempotent_write_is_implied_by_write_on_a_topic(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic
) -> None:
    """KIP-679 (Kafka 3.0): an idempotent or transactional producer needs no IDEMPOTENT_WRITE
    once it may WRITE a topic."""
    topic = await make_secured_topic("idem")
    client, prefix = _unique("relay"), _unique("relay-tx") + "-"
    principal = mtls_principal(client)
    options = {**_mtls(secured_kafka, client), "enable_idempotence": True}
    with pytest.raises(ClusterAuthorizationFailedError):
        await _start(options)  # InitProducerId: no IDEMPOTENT_WRITE, no WRITE on any topic
    await secured_kafka.grant(principal, "TOPIC", topic, ["WRITE"])
    await _produce(topic, options)
    await secured_kafka.grant(principal, "TRANSACTIONAL_ID", prefix, ["WRITE"], pattern="PREFIXED")
    producer = AIOKafkaProducer(**_mtls(secured_kafka, client), transactional_id=f"{prefix}1")
    try:
        await producer.start()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"tx", key=b"k")
    finally:
        await producer.stop()
