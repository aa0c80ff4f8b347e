"""Does Kafka let this worker do its job? Checked at start, without writing a record.

A worker that lacks an ACL would otherwise start and then retry one operation forever. So the
relay and the inbox ask first, each with the one request that Kafka authorizes as the real
operation would, and that changes nothing:

- WRITE on a topic: AddPartitionsToTxn in a transaction of the relay's own prefix, then aborted
  (the relay); a Produce request with no records, which Kafka refuses once it has authorized
  it (the inbox's dead-letter topics).
- READ on a topic: a Fetch of at most one byte.
- WRITE on the transactional-id prefix: InitProducerId for ``<group>.preflight``.
- READ on the group: FindCoordinator, which needs DESCRIBE on it (implied by READ).

A topic Kafka will not even describe (the worker has no ACL on it: READ and WRITE imply DESCRIBE)
is named with the operation the worker needs on it, as ``outboxkit acls`` prints it.

Each missing permission is one :class:`Missing`, named as in docs/security.md.
"""

from __future__ import annotations

import _ssl
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.client import AIOKafkaClient, ConnectionGroup, CoordinationType
from aiokafka.errors import (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    for_code,
)
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.protocol.transaction import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)
from aiokafka.structs import TopicPartition
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from outboxkit.core import kafka_clients
from outboxkit.core.settings import KafkaConnectionSettings

#: The transaction coordinator is not there yet (or moving): ask again.
_AGAIN = (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    GroupCoordinatorNotAvailableError,
    NotCoordinatorError,
)


@dataclass(frozen=True)
class Missing:
    """``operation`` on ``resource`` (``Topic:orders``, ``TransactionalId:prefix*``)."""

    operation: str
    resource: str

    def __str__(self) -> str:
        return f"{self.operation} on {self.resource}"


def principal(settings: KafkaConnectionSettings) -> str:
    """Who Kafka sees: ``User:<name>`` with SASL; with mutual TLS ``User:`` and the client
    certificate's subject, which the broker's ``ssl.principal.mapping.rules`` may shorten."""
    if settings.kafka_sasl_username:
        return f"User:{settings.kafka_sasl_username}"
    if settings.kafka_ssl_cert_file is not None:
        subject = certificate_subject(settings.kafka_ssl_cert_file)
        if subject is None:
            return "this client certificate's subject"
        return (
            f"User:{subject} (this client certificate's subject, unless the broker's "
            "ssl.principal.mapping.rules shorten it)"
        )
    return "this client"


#: Attribute names as a distinguished name (RFC 2253, as Kafka's principal) spells them.
_ATTRIBUTES = {
    "commonName": "CN",
    "organizationalUnitName": "OU",
    "organizationName": "O",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def certificate_subject(path: Path | str) -> str | None:
    """The subject of the first certificate of the PEM file ``path`` as Kafka writes it in a
    principal (RFC 2253: ``CN=relay,OU=payments,O=shop``), or ``None`` if it cannot be read."""
    decode = getattr(_ssl, "_test_decode_cert", None)  # the stdlib's only certificate reader
    if decode is None:
        return None
    try:
        subject = decode(str(path))["subject"]
    except (OSError, ValueError, KeyError, ssl.SSLError):
        return None
    rdns = [
        "+".join(f"{_ATTRIBUTES.get(name, name)}={_escape(value)}" for name, value in rdn)
        for rdn in reversed(subject)  # RFC 2253: the most specific first
    ]
    return ",".join(rdns) or None


def _escape(value: str) -> str:
    escaped = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return escaped


async def missing_relay_permissions(
    settings: KafkaConnectionSettings,
    group_id: str,
    topics: Sequence[str],
    *,
    transactional: bool,
    timeout_ms: int,
) -> list[Missing]:
    """What the relay of ``group_id`` may not do on ``topics``."""
    async with _client(settings, topics) as client:
        missing = await _missing_group_read(client, group_id, timeout_ms / 1000)
        missing += await _missing_reads(client, topics)
        if transactional:
            missing += await _missing_transactional_writes(client, group_id, topics, timeout_ms)
    return missing


async def missing_inbox_permissions(
    settings: KafkaConnectionSettings,
    group_id: str,
    topics: Sequence[str],
    dead_letter_topics: Sequence[str],
    *,
    within: float,
) -> list[Missing]:
    """What the inbox of ``group_id`` may not do: join it, read ``topics``, write
    ``dead_letter_topics``."""
    async with _client(settings, [*topics, *dead_letter_topics]) as client:
        return [
            *await _missing_group_read(client, group_id, within),
            *await _missing_reads(client, topics),
            *await _missing_plain_writes(client, dead_letter_topics),
        ]


@contextlib.asynccontextmanager
async def _client(
    settings: KafkaConnectionSettings, topics: Sequence[str]
) -> AsyncIterator[AIOKafkaClient]:
    client = kafka_clients.client(settings, client_id="outboxkit-preflight")
    await client.bootstrap()
    try:
        for topic in topics:
            client.add_topic(topic)
        await client.force_metadata_update()
        yield client
    finally:
        await client.close()


def _retrying(within: float) -> AsyncRetrying:
    """Ask again while a coordinator is not there yet (Kafka creates the offsets and the
    transaction logs at their first use) or moving."""
    return AsyncRetrying(
        retry=retry_if_exception_type(_AGAIN),
        wait=wait_exponential_jitter(multiplier=0.05, max=1),
        stop=stop_after_delay(within),
        reraise=True,
    )


async def _init_producer_id(
    client: AIOKafkaClient, transactional_id: str, timeout_ms: int
) -> tuple[int, Any]:
    """The transaction coordinator of ``transactional_id`` and its InitProducerId response."""
    async for attempt in _retrying(timeout_ms / 1000):
        with attempt:
            node = await client.coordinator_lookup(CoordinationType.TRANSACTION, transactional_id)
            response = await client.send(
                node,
                InitProducerIdRequest(transactional_id, timeout_ms),
                group=ConnectionGroup.COORDINATION,
            )
            if response.error_code:
                raise for_code(response.error_code)(transactional_id)
    return node, response


async def _missing_group_read(
    client: AIOKafkaClient, group_id: str, within: float
) -> list[Missing]:
    """Finding the group's coordinator needs DESCRIBE on the group, which READ implies: a
    member without either would wait for its group forever."""
    try:
        async for attempt in _retrying(within):
            with attempt:
                await client.coordinator_lookup(CoordinationType.GROUP, group_id)
    except GroupAuthorizationFailedError:
        return [Missing("READ", f"Group:{group_id}")]
    return []


def _undescribed(client: AIOKafkaClient, topic: str) -> bool:
    """Kafka refused to describe ``topic`` to this principal: it has no ACL on it at all."""
    return topic in client.cluster.unauthorized_topics


def _leader(client: AIOKafkaClient, topic: str) -> int | None:
    leader = client.cluster.leader_for_partition(TopicPartition(topic, 0))
    return None if leader is None or leader < 0 else int(leader)


async def _missing_reads(client: AIOKafkaClient, topics: Sequence[str]) -> list[Missing]:
    missing = []
    for topic in topics:
        leader = _leader(client, topic)
        if leader is None:
            if _undescribed(client, topic):
                missing.append(Missing("READ", f"Topic:{topic}"))
            continue  # else absent: the topic check says so
        request = FetchRequest(0, 0, 1, 1, [(topic, [(0, 0, 1)])])
        response = await client.send(leader, request)
        codes = [part[1] for _, parts in response.topics for part in parts]
        if TopicAuthorizationFailedError.errno in codes:
            missing.append(Missing("READ", f"Topic:{topic}"))
    return missing


async def _missing_plain_writes(client: AIOKafkaClient, topics: Sequence[str]) -> list[Missing]:
    missing = []
    for topic in topics:
        leader = _leader(client, topic)
        if leader is None:
            if _undescribed(client, topic):
                missing.append(Missing("WRITE", f"Topic:{topic}"))
            continue
        # No records: Kafka authorizes the request first, then refuses the empty batch.
        request = ProduceRequest(None, -1, 10_000, [(topic, [(0, b"")])])
        response = await client.send(leader, request)
        codes = [part[1] for _, parts in response.topics for part in parts]
        if TopicAuthorizationFailedError.errno in codes:
            missing.append(Missing("WRITE", f"Topic:{topic}"))
    return missing


async def _missing_transactional_writes(
    client: AIOKafkaClient, group_id: str, topics: Sequence[str], timeout_ms: int
) -> list[Missing]:
    """InitProducerId for ``<group_id>.preflight``, AddPartitionsToTxn of each topic's first
    partition, then an abort: no record is written."""
    transactional_id = f"{group_id}.preflight"
    try:
        node, init = await _init_producer_id(client, transactional_id, timeout_ms)
    except TransactionalIdAuthorizationFailed:
        # The topics' WRITE asked without a transaction, so that one run names every ACL.
        return [
            Missing("WRITE", f"TransactionalId:{group_id}.* (prefixed)"),
            *await _missing_plain_writes(client, topics),
        ]
    producer_id, epoch = init.producer_id, init.producer_epoch
    added = await client.send(
        node,
        AddPartitionsToTxnRequest(transactional_id, producer_id, epoch, [(t, [0]) for t in topics]),
        group=ConnectionGroup.COORDINATION,
    )
    missing = []
    for topic, partitions in added.errors:
        if any(code == TopicAuthorizationFailedError.errno for _, code in partitions):
            missing.append(Missing("WRITE", f"Topic:{topic}"))
    with contextlib.suppress(KafkaError):
        await client.send(
            node,
            EndTxnRequest(transactional_id, producer_id, epoch, False),
            group=ConnectionGroup.COORDINATION,
        )
    return missing
