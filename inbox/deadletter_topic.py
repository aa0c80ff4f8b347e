"""Dead-letter topics, for operators: read what the inbox dead-lettered, and replay it.

A replay publishes the original key, value and headers (without the ``outboxkit-error-*`` and
``outboxkit-source-*`` headers) to the topic the dead-letter topic belongs to (``<topic><suffix>``
→ ``<topic>``), at the partition the record came from; or to a topic the operator names, by
key. Never to the topic the ``outboxkit-source-topic`` header names: whoever may write to a
dead-letter topic writes its headers too, and a replay must not let them publish, with the
operator's rights, onto any topic they like (:func:`replay_targets` shows such a header, and
:func:`replay_dead_letters` does not obey it). The inbox never recorded
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

A replay leaves a note of itself in the dead-letter topic, after it: a *replay marker*, a record
with an empty value, no key, and the headers ``outboxkit-replay-of`` (the offset of the dead letter
it replayed, in the same partition) and ``outboxkit-replayed-to`` (``topic/partition@offset`` of
the published copy). :func:`read_dead_letters` attaches each marker to the dead letters it
replayed (:attr:`DeadLetter.replays`, every copy of that dead-lettering) and returns no marker;
so ``dlq list`` leaves out what was replayed, and ``dlq replay`` says so instead of replaying it
again unasked. A consumer of a dead-letter topic of its own skips a record with an
``outboxkit-replay-of`` header: it is not a dead letter.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

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

#: Headers of a replay marker: the offset of the dead letter it replayed (same partition), and
#: where the published copy went (``topic/partition@offset``).
REPLAY_OF = "outboxkit-replay-of"
REPLAYED_TO = "outboxkit-replayed-to"


@dataclass(frozen=True)
class DeadLetterReplay:
    """A replay of a dead letter, as its marker tells it."""

    #: ``topic/partition@offset`` of the published copy.
    to: str
    at: datetime


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
    #: The replays of this dead-lettering (of this record or of a copy of it), oldest first.
    replays: tuple[DeadLetterReplay, ...] = ()

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
        """Where the headers say the record came from: shown, never trusted as a destination
        (:func:`replay_targets`)."""
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
            "replayed": [{"to": r.to, "at": r.at.isoformat()} for r in self.replays],
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
    """Every committed dead letter of the dead-letter ``topics`` (the first ``limit``), oldest
    first (per partition), with the replays their markers tell (:attr:`DeadLetter.replays`:
    only markers read within the same scan, which ``limit`` ends)."""
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
        #: (topic, partition, offset of the dead letter) → its replays.
        replays: dict[tuple[str, int, int], list[DeadLetterReplay]] = defaultdict(list)
        remaining = {tp for tp in partitions if ends[tp] > await consumer.position(tp)}
        while remaining and (limit is None or len(letters) < limit):
            batches = await consumer.getmany(*remaining, timeout_ms=1000)
            for records in batches.values():
                for r in records:
                    letter = DeadLetter(
                        topic=r.topic,
                        partition=r.partition,
                        offset=r.offset,
                        timestamp=datetime.fromtimestamp(r.timestamp / 1000, UTC),
                        key=r.key,
                        value=r.value,
                        headers=tuple(r.headers or ()),
                    )
                    of = letter.header(REPLAY_OF)
                    if of is None:
                        letters.append(letter)
                    elif of.isdigit():
                        replay = DeadLetterReplay(
                            letter.header(REPLAYED_TO) or "?", letter.timestamp
                        )
                        replays[r.topic, r.partition, int(of)].append(replay)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        letters = letters if limit is None else letters[:limit]
        return _with_replays(letters, replays)
    finally:
        await consumer.stop()


def _with_replays(
    letters: Sequence[DeadLetter],
    replays: Mapping[tuple[str, int, int], Sequence[DeadLetterReplay]],
) -> list[DeadLetter]:
    """``letters``, each with the replays of its dead-lettering: of itself or of a copy (the
    same :attr:`DeadLetter.dedupe_key`)."""
    by_key: dict[tuple[str | None, ...], list[DeadLetterReplay]] = defaultdict(list)
    for letter in letters:
        by_key[letter.dedupe_key] += replays.get(
            (letter.topic, letter.partition, letter.offset), []
        )
    return [
        replace(letter, replays=tuple(sorted(by_key[letter.dedupe_key], key=lambda r: r.at)))
        for letter in letters
    ]


def origin_topic(dlq_topic: str, dlq_suffix: str) -> str:
    """The topic a dead-letter topic belongs to: ``<topic><dlq_suffix>`` → ``<topic>``."""
    if not dlq_suffix or not dlq_topic.endswith(dlq_suffix) or dlq_topic == dlq_suffix:
        raise DeadLetterError(f"{dlq_topic} is not a dead-letter topic (<topic>{dlq_suffix})")
    return dlq_topic.removesuffix(dlq_suffix)


@dataclass(frozen=True)
class ReplayTarget:
    """Where :func:`replay_dead_letters` publishes one dead letter."""

    letter: DeadLetter
    topic: str
    #: The partition the record came from; ``None``: the producer picks one by key (a topic
    #: the operator named, where the source partition means nothing).
    partition: int | None
    #: The topic the letter's ``outboxkit-source-topic`` header names when it is not the one
    #: its dead-letter topic belongs to: forged, or copied from elsewhere. Shown, not obeyed.
    misdirected: str | None = None


def replay_targets(
    letters: Sequence[DeadLetter], *, dlq_suffix: str, to: str | None = None
) -> list[ReplayTarget]:
    """Where each of ``letters`` is replayed: the topic its dead-letter topic belongs to, at
    the partition its ``outboxkit-source-partition`` header names; with ``to``, topic ``to``,
    partitioned by key. The ``outboxkit-source-topic`` header only flags a misdirected letter.
    """
    targets = []
    unknown = []
    for letter in letters:
        origin = origin_topic(letter.topic, dlq_suffix)
        named = letter.header(SOURCE_TOPIC)
        misdirected = named if named is not None and named != origin else None
        if to is not None:
            targets.append(ReplayTarget(letter, to, None, misdirected))
            continue
        partition = letter.header(SOURCE_PARTITION)
        if partition is None or not partition.isdigit():
            unknown.append(f"{letter.topic}/{letter.partition}@{letter.offset}")
            continue
        targets.append(ReplayTarget(letter, origin, int(partition), misdirected))
    if unknown:
        raise DeadLetterError(
            f"no source partition header on {', '.join(unknown)}: replay them with --to TOPIC"
        )
    return targets


async def replay_dead_letters(
    kafka: KafkaConnectionSettings,
    letters: Sequence[DeadLetter],
    *,
    dlq_suffix: str = ".dlq",
    to: str | None = None,
    on_sent: Callable[[DeadLetter], None] | None = None,
    on_unmarked: Callable[[DeadLetter, KafkaError], None] | None = None,
) -> int:
    """Publish ``letters`` again, in the order given, where :func:`replay_targets` says: never
    to the topic a letter's headers name; after each, its replay marker in its dead-letter
    topic (a marker Kafka refuses, e.g. for want of WRITE on the dead-letter topic, goes to
    ``on_unmarked``: the replay itself happened). Nothing is sent when a target partition does
    not exist."""
    targets = replay_targets(letters, dlq_suffix=dlq_suffix, to=to)
    if not targets:
        return 0
    await _check_partitions(kafka, targets)
    producer = kafka_clients.producer(kafka, acks="all", client_id="outboxkit.dlq.replay")
    await producer.start()
    try:
        for target in targets:
            letter = target.letter
            headers = [(name, value) for name, value in letter.headers if name not in ADDED]
            sent = await producer.send_and_wait(
                target.topic,
                letter.value,
                key=letter.key,
                partition=target.partition,
                headers=headers,
            )
            try:
                await producer.send_and_wait(
                    letter.topic,
                    b"",
                    partition=letter.partition,
                    headers=[
                        (REPLAY_OF, str(letter.offset).encode()),
                        (REPLAYED_TO, f"{target.topic}/{sent.partition}@{sent.offset}".encode()),
                    ],
                )
            except KafkaError as exc:
                if on_unmarked is None:
                    raise
                on_unmarked(letter, exc)
            if on_sent is not None:
                on_sent(letter)
    finally:
        await producer.stop()
    return len(targets)


async def _check_partitions(
    kafka: KafkaConnectionSettings, targets: Sequence[ReplayTarget]
) -> None:
    """Every target topic exists and has the target partition (a header may name any)."""
    try:
        counts = await partition_counts(kafka, sorted({t.topic for t in targets}))
    except ConfigurationError as exc:
        raise DeadLetterError(str(exc)) from None
    beyond = [
        f"{t.letter.topic}/{t.letter.partition}@{t.letter.offset} names partition "
        f"{t.partition} of {t.topic}, which has {counts[t.topic]}"
        for t in targets
        if t.partition is not None and t.partition >= counts[t.topic]
    ]
    if beyond:
        raise DeadLetterError(f"no such partition: {'; '.join(beyond)}")
