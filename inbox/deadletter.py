"""Dead-letter records: the original key, value and headers, plus headers that say what went
wrong and where the record came from, so an operator can inspect and replay it.

A dead letter always fits: :func:`dead_letter` sizes it the way the producer will (aiokafka's
own estimate) and, when the copy would be larger than the limit, writes a truncated copy that
says so (``outboxkit-truncated``, the original size, and where the original is: its source
topic, partition and offset, where Kafka keeps it for that topic's retention). A record that
cannot even be read keeps what could be recovered of it (:class:`UnreadableRecord`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    CorruptRecordException,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnsupportedVersionError,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import ConsumerRecord

from outboxkit.inbox.kafka import UnreadableRecord
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.progress import PartitionProgress

logger = structlog.get_logger("outboxkit.inbox")

#: Header names added to a dead-lettered record.
ERROR_REASON = "outboxkit-error-reason"
ERROR_MESSAGE = "outboxkit-error-message"
ERROR_TYPE = "outboxkit-error-type"
SOURCE_TOPIC = "outboxkit-source-topic"
SOURCE_PARTITION = "outboxkit-source-partition"
SOURCE_OFFSET = "outboxkit-source-offset"
INBOX = "outboxkit-inbox"
#: Only on a truncated copy: ``true``, and the size of the full copy in bytes.
TRUNCATED = "outboxkit-truncated"
ORIGINAL_SIZE = "outboxkit-original-size"
#: Only on a copy whose original headers did not fit: how many were left out.
HEADERS_DROPPED = "outboxkit-headers-dropped"
#: Only on a copy of a record with neither key nor value (Kafka takes no such record, so the
#: copy has an empty value instead).
NULL_VALUE = "outboxkit-null-value"
ADDED = (
    ERROR_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    INBOX,
    TRUNCATED,
    ORIGINAL_SIZE,
    HEADERS_DROPPED,
    NULL_VALUE,
)

#: Longest error message kept in a header (the log has the full one).
MESSAGE_LIMIT = 1000
#: Longest key kept in a truncated copy (the key still routes it to a dead-letter partition).
KEY_LIMIT = 1024

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """What to send to the dead-letter topic."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    #: The copy was cut to fit; ``size`` is then the full copy's.
    truncated: bool
    size: int


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """The producer's upper-bound estimate of a record's size (what ``max_request_size`` is
    checked against)."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(headers))
    return size


def dead_letter(
    record: ConsumerRecord[bytes, bytes] | UnreadableRecord,
    *,
    inbox: str,
    reason: str,
    error: BaseException | str,
    max_bytes: int,
) -> DeadLetterRecord:
    """The dead-letter copy of ``record``, at most ``max_bytes`` as the producer counts."""
    message = error if isinstance(error, str) else str(error)
    error_type = "UnreadableRecord" if isinstance(error, str) else type(error).__qualname__
    ours: Headers = [
        (ERROR_REASON, reason.encode()),
        (ERROR_MESSAGE, message[:MESSAGE_LIMIT].encode("utf-8", "replace")),
        (ERROR_TYPE, error_type.encode()),
        (SOURCE_TOPIC, record.topic.encode()),
        (SOURCE_PARTITION, str(record.partition).encode()),
        (SOURCE_OFFSET, str(record.offset).encode()),
        (INBOX, inbox.encode()),
    ]
    kept = _original_headers(record)
    original_value = record.value
    if record.key is None and original_value is None:
        ours.append((NULL_VALUE, b"true"))
        original_value = b""
    full = record_size(record.key, original_value, [*kept, *ours])
    if full <= max_bytes:
        return DeadLetterRecord(record.key, original_value, [*kept, *ours], False, full)
    # Too large: keep our headers, a short key, the original headers if they are small, and as
    # much of the value as fits.
    ours += [(TRUNCATED, b"true"), (ORIGINAL_SIZE, str(full).encode())]
    key = record.key[:KEY_LIMIT] if record.key is not None else None
    if record_size(key, b"", [*kept, *ours]) > max_bytes // 2:
        ours.append((HEADERS_DROPPED, str(len(kept)).encode()))
        kept = []
    headers = [*kept, *ours]
    room = max_bytes - record_size(key, b"", headers)
    # Each byte of the value costs one byte; the value's length prefix grows by at most a few
    # bytes, which the estimate's own overhead already covers.
    value = original_value[: max(room - 8, 0)] if original_value is not None else None
    if key is None and value is None:
        value = b""
    return DeadLetterRecord(key, value, headers, True, full)


def pointer_only(letter: DeadLetterRecord) -> DeadLetterRecord:
    """The same dead letter without the original's key, value and headers (an empty value: Kafka
    needs a key or a value): only where it is and what went wrong. For a dead-letter topic whose
    own size limit is lower than assumed."""
    ours = [(name, value) for name, value in letter.headers if name in ADDED]
    if not any(name == TRUNCATED for name, _ in ours):
        ours += [(TRUNCATED, b"true"), (ORIGINAL_SIZE, str(letter.size).encode())]
    return DeadLetterRecord(None, b"", ours, True, letter.size)


def _original_headers(record: ConsumerRecord[bytes, bytes] | UnreadableRecord) -> Headers:
    """The record's own headers (those a previous dead-lettering added are replaced); a header
    name that is not UTF-8 (an unreadable record's) is kept with its bytes escaped."""
    if isinstance(record, UnreadableRecord):
        named: Sequence[tuple[str, bytes | None]] = [
            (name.decode("utf-8", "backslashreplace"), value) for name, value in record.headers
        ]
    else:
        named = record.headers or ()
    return [(name, value) for name, value in named if name not in ADDED]


#: Producer errors that retrying the same send cannot fix: the record or its topic is refused.
PERMANENT_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    UnsupportedVersionError,
    CorruptRecordException,
)
_TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)


class DeadLetterWriter:
    """Writes dead letters with ``producer``: a retriable failure (broker away, topic missing)
    is retried with ``pause`` between attempts, each logged and counted; a permanent one is
    logged and counted once, and :meth:`write` returns ``False`` so that the caller parks the
    record's partition instead of spinning on it. A dead letter the topic refuses as too large
    (its ``max.message.bytes`` below ``max_bytes``) is sent again as a pointer only."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        *,
        inbox: str,
        suffix: str,
        max_bytes: int,
        metrics: InboxMetrics,
        pause: Callable[[], Awaitable[None]],
    ) -> None:
        self._producer = producer
        self._inbox = inbox
        self._suffix = suffix
        self._max_bytes = max_bytes
        self._metrics = metrics
        self._pause = pause
        self._log = logger.bind(inbox=inbox)

    async def write(
        self,
        record: ConsumerRecord[bytes, bytes] | UnreadableRecord,
        reason: str,
        error: BaseException | str,
        progress: PartitionProgress,
    ) -> bool:
        topic = f"{record.topic}{self._suffix}"
        where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        letter = dead_letter(
            record, inbox=self._inbox, reason=reason, error=error, max_bytes=self._max_bytes
        )
        if letter.truncated:
            self._metrics.dead_letters_truncated.labels(self._inbox).inc()
            self._log.warning(
                "dead letter truncated to fit; the original stays in its topic",
                size=letter.size,
                max_bytes=self._max_bytes,
                **where,
            )
        while True:
            try:
                await self._producer.send_and_wait(
                    topic, letter.value, key=letter.key, headers=letter.headers
                )
                break
            except KafkaError as exc:
                self._metrics.dead_letter_failures.labels(self._inbox, type(exc).__name__).inc()
                progress.error(f"cannot write to {topic}: {exc!r}")
                if isinstance(exc, _TOO_LARGE) and letter.value != b"":
                    self._log.error(
                        "the dead-letter topic refused the record as too large; writing a "
                        "pointer to the original instead",
                        dlq=topic,
                        hint="raise the topic's max.message.bytes or lower OUTBOXKIT_DLQ_MAX_BYTES",
                        **where,
                    )
                    letter = pointer_only(letter)
                    continue
                if isinstance(exc, PERMANENT_ERRORS):
                    self._log.error(
                        "cannot dead-letter the record, and retrying will not help: the "
                        "partition is parked (its other records wait) until the worker restarts",
                        dlq=topic,
                        error=repr(exc),
                        hint="check the dead-letter topic's name, ACLs and size limit",
                        **where,
                    )
                    return False
                self._log.error(
                    "cannot write to the dead-letter topic, retrying",
                    dlq=topic,
                    error=repr(exc),
                    hint="create the topic, or fix OUTBOXKIT_DLQ_SUFFIX",
                    **where,
                )
                await self._pause()
        self._metrics.dead_lettered.labels(self._inbox, reason).inc()
        self._log.warning(
            "record dead-lettered",
            reason=reason,
            error=(error if isinstance(error, str) else str(error))[:500],
            **where,
        )
        return True
