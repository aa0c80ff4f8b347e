"""Dead-letter records: the original key, value and headers, plus headers that say what went
wrong and where the record came from, so an operator can inspect and replay it."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.structs import ConsumerRecord

#: Header names added to a dead-lettered record.
ERROR_REASON = "outboxkit-error-reason"
ERROR_MESSAGE = "outboxkit-error-message"
ERROR_TYPE = "outboxkit-error-type"
SOURCE_TOPIC = "outboxkit-source-topic"
SOURCE_PARTITION = "outboxkit-source-partition"
SOURCE_OFFSET = "outboxkit-source-offset"
INBOX = "outboxkit-inbox"
ADDED = (
    ERROR_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    INBOX,
)


def dead_letter_headers(
    record: ConsumerRecord[bytes, bytes],
    *,
    inbox: str,
    reason: str,
    error: BaseException,
) -> list[tuple[str, bytes]]:
    """The record's own headers (those a previous dead-lettering added are replaced) and ours."""
    original: Sequence[tuple[str, bytes]] = record.headers or ()
    kept = [(name, value) for name, value in original if name not in ADDED]
    return [
        *kept,
        (ERROR_REASON, reason.encode()),
        (ERROR_MESSAGE, str(error)[:4000].encode("utf-8", "replace")),
        (ERROR_TYPE, type(error).__qualname__.encode()),
        (SOURCE_TOPIC, record.topic.encode()),
        (SOURCE_PARTITION, str(record.partition).encode()),
        (SOURCE_OFFSET, str(record.offset).encode()),
        (INBOX, inbox.encode()),
    ]
