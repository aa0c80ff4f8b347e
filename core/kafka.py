"""Kafka helpers shared by the commands and workers: partition counts, creating and describing
topics, leaving a group."""

from __future__ import annotations

import asyncio
import difflib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    KafkaError,
    NotCoordinatorForGroupError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    for_code,
)

from outboxkit.core import kafka_clients
from outboxkit.core.exceptions import (
    ConfigurationError,
    CoordinatorNotReadyError,
    MissingTopicsError,
    TopicsNotDescribedError,
)
from outboxkit.core.settings import KafkaConnectionSettings

logger = structlog.get_logger("outboxkit")

T = TypeVar("T")


async def partition_counts(kafka: KafkaConnectionSettings, topics: Sequence[str]) -> dict[str, int]:
    """Each topic's partition count; :class:`ConfigurationError` names the missing topics."""
    async with admin_client(kafka, request_timeout=kafka_request_timeout(kafka)) as admin:
        return await topic_partition_counts(admin, topics)


async def topic_partition_counts(
    admin: AIOKafkaAdminClient, topics: Sequence[str]
) -> dict[str, int]:
    """:func:`partition_counts` through an admin client the caller keeps open."""
    described = await admin.describe_topics(list(topics))
    counts = {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
    missing = sorted(set(topics) - {t for t, n in counts.items() if n})
    if missing:
        raise missing_topics(missing, await admin.list_topics())
    return {t: counts[t] for t in topics}


#: What Kafka raises for an operation a principal may not do.
AUTHORIZATION_ERRORS = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    ClusterAuthorizationFailedError,
)


def denied(exc: BaseException, topic_operation: str | None = None) -> str:
    """The permission an authorization error stands for, e.g. ``READ on Group:relays``
    (``topic_operation``: what the caller did to a topic, when it knows)."""
    names = exc.args[0] if exc.args else ""
    if isinstance(names, set | frozenset | list | tuple):
        names = ", ".join(sorted(map(str, names)))
    if isinstance(exc, GroupAuthorizationFailedError):
        return f"READ on Group:{names}"
    if isinstance(exc, TransactionalIdAuthorizationFailed):
        return f"WRITE on TransactionalId:{names}"
    if isinstance(exc, TopicAuthorizationFailedError) and topic_operation:
        return f"{topic_operation} on Topic:{names}"
    if isinstance(exc, TopicAuthorizationFailedError):
        return f"the operation on Topic:{names} (READ to consume, WRITE to publish)"
    return "IDEMPOTENT_WRITE on the cluster (or WRITE on a topic)"


#: What Kafka answers while a consumer group's coordinator is not ready: a new cluster creates
#: its offsets topic at the first request about a group, a broker that took over a group loads
#: it first, and a group that moved is asked of the wrong broker until the next lookup.
COORDINATOR_ERRORS = (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    NotCoordinatorForGroupError,
)
#: How long a command waits for a coordinator: long enough for a new cluster's offsets topic.
COORDINATOR_WAIT = 10.0
_COORDINATOR_RETRY = 0.5


async def with_coordinator(
    group: str, call: Callable[[], Awaitable[T]], *, within: float = COORDINATOR_WAIT
) -> T:
    """``call()`` (a request about consumer group ``group``), asked again while the group's
    coordinator is not ready (:data:`COORDINATOR_ERRORS`), for up to ``within`` seconds; then
    :class:`CoordinatorNotReadyError`."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except COORDINATOR_ERRORS as exc:
            if time.monotonic() >= deadline:
                raise CoordinatorNotReadyError(
                    f"Kafka's coordinator of consumer group {group} is not ready after "
                    f"{within:g} s ({type(exc).__name__})"
                ) from exc
            await asyncio.sleep(_COORDINATOR_RETRY)


def missing_topics(topics: Sequence[str], existing: Iterable[str] = ()) -> MissingTopicsError:
    """The error for topics that Kafka does not have: one line, with the topic of ``existing``
    each resembles (a typo) and the command that creates them."""
    them = "it" if len(topics) == 1 else "them"
    return MissingTopicsError(
        f"{_topics(topics)} {'does' if len(topics) == 1 else 'do'} not exist on Kafka"
        f"{did_you_mean(topics, existing)}: create {them} with `{create_command(topics)}` (or "
        "fix OUTBOXKIT_TOPICS)"
    )


def _topics(names: Sequence[str]) -> str:
    return f"{'topic' if len(names) == 1 else 'topics'} {', '.join(names)}"


def did_you_mean(missing: Sequence[str], existing: Iterable[str]) -> str:
    """`` (did you mean orders?)`` for a missing topic that resembles one that exists (a typo);
    ``(ordrs: did you mean orders?; …)`` for several; empty when none does. Kafka's internal
    topics (``__consumer_offsets``) are never suggested."""
    names = [name for name in existing if not name.startswith("__")]
    close = {
        topic: found[0]
        for topic in missing
        if (found := difflib.get_close_matches(topic, names, n=1, cutoff=0.75))
    }
    if not close:
        return ""
    if len(missing) == 1:
        return f" (did you mean {close[missing[0]]}?)"
    return " (" + "; ".join(f"{topic}: did you mean {name}?" for topic, name in close.items()) + ")"


def missing_topics_line(missing: Sequence[str], existing: Iterable[str], where: str) -> str:
    """``outboxkit check``'s line for topics Kafka at ``where`` does not have."""
    them = "it" if len(missing) == 1 else "them"
    return (
        f"{_topics(missing)} not found on Kafka at {where}{did_you_mean(missing, existing)}: "
        f"create {them} with `{create_command(missing)}`"
    )


def create_command(topics: Sequence[str], dlq_suffix: str = ".dlq") -> str:
    """The ``outboxkit topics create`` command that creates ``topics`` (a dead-letter topic is
    created with its source topic, so the source is named instead)."""
    names = dict.fromkeys(t.removesuffix(dlq_suffix) if dlq_suffix else t for t in topics)
    return "outboxkit topics create " + " ".join(names)


#: Topic configs ``outboxkit topics describe`` shows (the ones that matter for the outbox).
DESCRIBED_CONFIGS = ("cleanup.policy", "min.insync.replicas", "retention.ms")


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create. ``replication_factor=None``: 3, or the number of brokers if fewer."""

    name: str
    partitions: int
    replication_factor: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicState:
    """A topic as Kafka has it. ``created``: this call created it (``False``: it existed)."""

    name: str
    partitions: int
    replication_factor: int
    created: bool = False
    #: Partitions whose in-sync replicas are fewer than their replicas, or that have no leader.
    under_replicated: int = 0
    configs: dict[str, str] = field(default_factory=dict)


def kafka_request_timeout(kafka: KafkaConnectionSettings) -> float:
    """Seconds an admin request may take: the settings' connect timeout where they have one."""
    return float(getattr(kafka, "connect_timeout", 10.0))


@asynccontextmanager
async def admin_client(
    kafka: KafkaConnectionSettings,
    *,
    request_timeout: float = 10.0,
    client_id: str = "outboxkit",
) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = kafka_clients.admin(
        kafka, client_id=client_id, request_timeout_ms=int(request_timeout * 1000)
    )
    try:
        await admin.start()
        yield admin
    finally:
        await admin.close()


async def ensure_topics(
    kafka: KafkaConnectionSettings, specs: Sequence[TopicSpec], *, request_timeout: float = 10.0
) -> list[TopicState]:
    """Create the topics of ``specs`` that do not exist; leave existing ones as they are.

    Idempotent and safe to run concurrently (a topic another caller just created counts as
    existing). Raises :class:`ConfigurationError` when Kafka refuses a spec (a replication
    factor above the broker count, an unknown config…)."""
    async with admin_client(kafka, request_timeout=request_timeout) as admin:
        brokers = len((await admin.describe_cluster())["brokers"])
        requests = [
            NewTopic(
                spec.name,
                spec.partitions,
                spec.replication_factor or min(3, brokers),
                topic_configs=_default_configs(spec, brokers),
            )
            for spec in specs
        ]
        response = await admin.create_topics(requests, timeout_ms=int(request_timeout * 1000))
        created = set()
        for name, code, message in _topic_errors(response):
            if code == 0:
                created.add(name)
            elif code != TopicAlreadyExistsError.errno:
                raise ConfigurationError(f"Kafka refused to create topic {name}: {message}")
        # A new topic's metadata reaches every broker a moment after the controller answered.
        deadline = time.monotonic() + request_timeout
        while True:
            try:
                states = await _describe(admin, [spec.name for spec in specs])
                break
            except MissingTopicsError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
            except TopicsNotDescribedError as exc:
                raise TopicsNotDescribedError(
                    exc.topics, created=[t for t in exc.topics if t in created]
                ) from None
    return [
        TopicState(s.name, s.partitions, s.replication_factor, s.name in created) for s in states
    ]


def _default_configs(spec: TopicSpec, brokers: int) -> dict[str, str]:
    """With three replicas or more, ``min.insync.replicas=2`` unless given: an ``acks=all``
    write then survives the loss of one broker (with Kafka's default of 1 it may not)."""
    configs = dict(spec.configs)
    replicas = spec.replication_factor or min(3, brokers)
    if replicas >= 3:
        configs.setdefault("min.insync.replicas", "2")
    return configs


def _topic_errors(response: Any) -> list[tuple[str, int, str | None]]:
    errors = []
    for item in response.topic_errors:
        name, code = item[0], item[1]
        message = item[2] if len(item) > 2 else None
        errors.append((name, code, message or (for_code(code).__name__ if code else None)))
    return errors


async def describe_topics(
    kafka: KafkaConnectionSettings, topics: Sequence[str], *, request_timeout: float = 10.0
) -> list[TopicState]:
    """Partitions, replication and the :data:`DESCRIBED_CONFIGS` of ``topics``; raises
    :class:`ConfigurationError` naming the missing ones."""
    async with admin_client(kafka, request_timeout=request_timeout) as admin:
        return await _describe(admin, topics)


async def _describe(admin: AIOKafkaAdminClient, topics: Sequence[str]) -> list[TopicState]:
    described = {t["topic"]: t for t in await admin.describe_topics(list(topics))}
    refused = [
        t
        for t in topics
        if t in described and described[t]["error_code"] == TopicAuthorizationFailedError.errno
    ]
    if refused:  # with an authorizer, such a topic may exist or not: said as what it is
        raise TopicsNotDescribedError(refused)
    missing = [
        t
        for t in topics
        if t not in described or described[t]["error_code"] or not described[t]["partitions"]
    ]
    if missing:
        raise missing_topics(missing)
    resources = [
        ConfigResource(ConfigResourceType.TOPIC, t, dict.fromkeys(DESCRIBED_CONFIGS))
        for t in topics
    ]
    configs: dict[str, dict[str, str]] = {t: {} for t in topics}
    try:
        for response in await admin.describe_configs(resources):
            for resource in response.resources:
                name, entries = resource[3], resource[4]
                configs[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    except KafkaError:  # a broker without DescribeConfigs (Tansu): the configs stay unknown
        pass
    states = []
    for topic in topics:
        partitions = described[topic]["partitions"]
        states.append(
            TopicState(
                name=topic,
                partitions=len(partitions),
                replication_factor=max(len(p["replicas"]) for p in partitions),
                under_replicated=sum(
                    1 for p in partitions if p["leader"] < 0 or len(p["isr"]) < len(p["replicas"])
                ),
                configs=configs[topic],
            )
        )
    return states


async def leave_group(stop: Awaitable[None], *, within: float, who: str) -> None:
    """Await a group member's ``stop()`` (which leaves the group), at most ``within`` seconds.

    A stop that hangs — a coordinator that does not answer, a rebalance that does not end —
    must not keep a worker from exiting: Kafka drops a member that stopped heartbeating after
    its session timeout anyway, and no guarantee rests on a clean leave (a relay's next owner
    fences it; an inbox's next owner absorbs what it handles again)."""
    try:
        async with asyncio.timeout(within):
            await stop
    except Exception as exc:  # TimeoutError too
        logger.warning(
            "could not leave the consumer group cleanly; Kafka drops this member after its "
            "session timeout",
            member=who,
            error=repr(exc),
        )


class StatusClients:
    """An admin client and a ``read_committed`` consumer that start and stop together: what a
    status reader keeps open (a group's state from the one, its topics' ends from the other),
    so that each read costs Kafka a few requests, not new connections."""

    def __init__(self, admin: AIOKafkaAdminClient, consumer: AIOKafkaConsumer) -> None:
        self._admin = admin
        self._consumer = consumer

    async def __aenter__(self) -> Self:
        try:
            await self._admin.start()
            await self._consumer.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            await self._consumer.stop()
        finally:
            await self._admin.close()
