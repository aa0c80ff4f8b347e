"""Dead-letter topics, for operators: read what the inbox dead-lettered, and replay it.

A replay publishes the original key, value and headers (without the ``outboxkit-error-*`` and
``outboxkit-source-*`` headers) to the partition the record came from. The inbox never recorded
a dead-lettered event (its transaction rolled back), so the replayed event takes effect once
when its handler succeeds; replaying it twice is absorbed by the dedupe like any duplicate.
A replayed event arrives after newer events of its key: handlers that care about per-key order
must tolerate that (or the operator replays before newer events of the key were produced).

Dead-lettering is at least once: a worker that dies between writing a dead letter and committing
the record's offset dead-letters it again after the restart. Both copies carry the same
:attr:`DeadLetter.dedupe_key` — (inbox, source topic, partition, offset) — which a consumer of a
dead-letter topic should dedupe on (the event id alone would merge a replayed event that failed
again, a new dead letter, with the first one). ``outboxkit inbox dlq list`` marks the copies and
``replay`` publishes each record once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from aiokafka import TopicPartition

from outboxkit.core import kafka_clients
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.kafka import partition_counts
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.inbox.deadletter import (
    ADDED,
    ERROR_MESSAGE,
    ERROR_REASON,
    ERROR_TYPE,
    INBOX,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
)
from outboxkit.inbox.exceptions import DeadLetterError


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter topic and what its headers say."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> str | None:
        for header, value in self.headers:
            if header == name:
                return value.decode("utf-8", "replace")
        return None

    @property
    def event_id(self) -> str | None:
        return self.header("ce_id")

    @property
    def source(self) -> TopicPartition | None:
        topic, partition = self.header(SOURCE_TOPIC), self.header(SOURCE_PARTITION)
        if topic is None or partition is None or not partition.isdigit():
            return None
        return TopicPartition(topic, int(partition))

    @property
    def dedupe_key(self) -> tuple[str | None, str | None, str | None, str | None]:
        """The same for every copy of one dead-lettering (dead-lettering is at least once):
        the inbox and the source record's topic, partition and offset."""
        return (
            self.header(INBOX),
            self.header(SOURCE_TOPIC),
            self.header(SOURCE_PARTITION),
            self.header(SOURCE_OFFSET),
        )

    def summary(self) -> dict[str, object]:
        """What ``outboxkit inbox dlq list --json`` prints for this record."""
        return {
            "dlq": f"{self.topic}/{self.partition}@{self.offset}",
            "timestamp": self.timestamp.isoformat(),
            "event_id": self.event_id,
            "event_type": self.header("ce_type"),
            "key": None if self.key is None else self.key.decode("utf-8", "replace"),
            "reason": self.header(ERROR_REASON),
            "error_type": self.header(ERROR_TYPE),
            "error": self.header(ERROR_MESSAGE),
            "source": f"{self.header(SOURCE_TOPIC)}/{self.header(SOURCE_PARTITION)}"
            f"@{self.header(SOURCE_OFFSET)}",
            "inbox": self.header(INBOX),
        }


def unique_dead_letters(letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """``letters`` without the later copies of one dead-lettering (same :attr:`dedupe_key`)."""
    seen: set[tuple[str | None, ...]] = set()
    unique = []
    for letter in letters:
        if letter.dedupe_key not in seen:
            seen.add(letter.dedupe_key)
            unique.append(letter)
    return unique


async def read_dead_letters(
    kafka: KafkaConnectionSettings, topics: Sequence[str], *, limit: int | None = None
) -> list[DeadLetter]:
    """Every committed record of the dead-letter ``topics``, oldest first (per partition)."""
    consumer = kafka_clients.consumer(
        kafka,
        enable_auto_commit=False,
        isolation_level="read_committed",
        client_id="outboxkit.dlq",
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()  # a consumer that could not start is closed too (no warning)
        raise
    try:
        try:
            counts = await partition_counts(kafka, topics)
        except ConfigurationError as exc:
            raise DeadLetterError(str(exc)) from None
        partitions = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        letters: list[DeadLetter] = []
        remaining = {tp for tp in partitions if ends[tp] > await consumer.position(tp)}
        while remaining and (limit is None or len(letters) < limit):
            batches = await consumer.getmany(*remaining, timeout_ms=1000)
            for records in batches.values():
                letters += [
                    DeadLetter(
                        topic=r.topic,
                        partition=r.partition,
                        offset=r.offset,
                        timestamp=datetime.fromtimestamp(r.timestamp / 1000, UTC),
                        key=r.key,
                        value=r.value,
                        headers=tuple(r.headers or ()),
                    )
                    for r in records
                ]
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return letters if limit is None else letters[:limit]
    finally:
        await consumer.stop()


async def replay_dead_letters(
    kafka: KafkaConnectionSettings,
    letters: Sequence[DeadLetter],
    *,
    on_sent: Callable[[DeadLetter], None] | None = None,
) -> int:
    """Publish ``letters`` to the partitions they came from, in the order given."""
    unknown = [f"{d.topic}/{d.partition}@{d.offset}" for d in letters if d.source is None]
    if unknown:
        raise DeadLetterError(f"no source topic/partition header on {', '.join(unknown)}")
    producer = kafka_clients.producer(kafka, acks="all", client_id="outboxkit.dlq.replay")
    await producer.start()
    try:
        for letter in letters:
            source = letter.source
            assert source is not None
            headers = [(name, value) for name, value in letter.headers if name not in ADDED]
            await producer.send_and_wait(
                source.topic,
                letter.value,
                key=letter.key,
                partition=source.partition,
                headers=headers,
            )
            if on_sent is not None:
                on_sent(letter)
    finally:
        await producer.stop()
    return len(letters)
