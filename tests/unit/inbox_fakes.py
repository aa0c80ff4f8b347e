"""What drives the inbox's parts without Kafka: consumed records built from events (or bytes),
a producer that takes (or refuses) dead letters, and a consumer that takes offset commits.
The store is the real in-memory one (:class:`~outboxkit.inbox.memory.InMemoryInboxStore`).

- :class:`DeadLetterProducer` stands in for the dead-letter producer of a
  :class:`~outboxkit.inbox.deadletter.DeadLetterWriter`: it keeps what it was sent, and raises
  the errors queued in ``failures`` first.
- :class:`CommitLog` is the :class:`~outboxkit.inbox.offsets.OffsetConsumer` of an offset
  committer: each partition's end, the positions past transaction markers, and every commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition
from prometheus_client import CollectorRegistry

from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox import InboxMetrics, InboxSettings
from outboxkit.inbox.deadletter import ERROR_REASON, DeadLetterWriter
from outboxkit.inbox.handlers import Inbox
from outboxkit.schemas import Event, encode

TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)


class Charged(Event, type="Charged", topic=TOPIC, key_field="order"):
    order: str


def settings(**overrides: Any) -> InboxSettings:
    """Inbox settings for unit tests: retries without waiting long."""
    values: dict[str, Any] = {
        "database_url": "memory://",
        "topics": [TOPIC],
        "retry_backoff_max": 0.01,
        "handler_attempts": 2,
    }
    return InboxSettings(**(values | overrides))


def metrics() -> InboxMetrics:
    return InboxMetrics(CollectorRegistry())


def charging_inbox(*, batch: bool = False) -> Inbox[MemoryTransaction]:
    """An inbox whose handler records ("charge", order), and raises for orders named "bad";
    ``batch``: a batch handler that does so for each of its events (and keeps its calls' orders
    in ``inbox.calls``)."""
    inbox = Inbox[MemoryTransaction]("payments")
    calls: list[list[str]] = []

    if batch:

        @inbox.batch_handler(Charged)
        async def charge_all(events: Sequence[Charged], tx: MemoryTransaction) -> None:
            calls.append([event.order for event in events])
            for event in events:
                await charge(event, tx)

    else:
        inbox.handler(Charged)(charge)
    inbox.calls = calls  # type: ignore[attr-defined]
    return inbox


async def charge(event: Charged, tx: MemoryTransaction) -> None:
    if event.order == "bad":
        raise ValueError("card declined")
    tx.record(("charge", event.order))


def record(offset: int, event: Event | None = None, *, value: bytes | None = None) -> Any:
    """The consumed record at ``offset`` of :data:`TP`: ``event`` encoded, or raw ``value``."""
    if event is None:
        return ConsumerRecord(TOPIC, 0, offset, 0, 0, b"k", value, None, 1, len(value or b""), [])
    encoded = encode(event, source="urn:test")
    return ConsumerRecord(
        TOPIC,
        0,
        offset,
        0,
        0,
        encoded.key,
        encoded.value,
        None,
        len(encoded.key),
        len(encoded.value),
        list(encoded.headers),
    )


@dataclass
class DeadLetterProducer:
    sent: list[tuple[str, bytes | None, list[tuple[str, bytes | None]]]] = field(
        default_factory=list
    )
    failures: list[Exception] = field(default_factory=list)

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.sent.append((topic, value, list(headers)))

    def reasons(self) -> list[str]:
        """The ``outboxkit-error-reason`` of each dead letter sent, in order."""
        return [(dict(headers)[ERROR_REASON] or b"").decode() for _, _, headers in self.sent]

    def writer(self, inbox_metrics: InboxMetrics) -> DeadLetterWriter:
        async def pause() -> None:
            await asyncio.sleep(0)

        return DeadLetterWriter(
            cast(AIOKafkaProducer, self),
            inbox="payments",
            suffix=".dlq",
            max_bytes=1_000_000,
            metrics=inbox_metrics,
            pause=pause,
        )


@dataclass
class CommitLog:
    """Partitions assigned, each one's end (last stable offset), the positions a caught-up
    partition's offset moves to past invisible markers, and every commit made."""

    ends: dict[TopicPartition, int] = field(default_factory=dict)
    past_markers: dict[TopicPartition, int] = field(default_factory=dict)
    commits: list[dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=list)
    failures: list[Exception] = field(default_factory=list)

    def assignment(self) -> set[TopicPartition]:
        return set(self.ends)

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return self.ends.get(tp)

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.commits.append(dict(offsets))

    async def past_invisible(self, tp: TopicPartition, handled: int) -> int | None:
        return self.past_markers.get(tp)

    def committed(self, tp: TopicPartition = TP) -> int | None:
        """The last offset committed for ``tp``."""
        for commit in reversed(self.commits):
            if tp in commit:
                return int(commit[tp].offset)
        return None
