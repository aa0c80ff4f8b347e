"""A consumed Kafka record, as the registry reads it: what it needs of one (aiokafka's
``ConsumerRecord`` fits), its timestamp and its size."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Protocol


class KafkaRecord(Protocol):
    """What the decoder needs of a consumed record; aiokafka's ``ConsumerRecord`` fits."""

    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


def record_timestamp(record: object) -> datetime | None:
    """A consumed record's timestamp (aiokafka's ``timestamp``, milliseconds since the epoch)
    as an aware datetime, or ``None`` when it has none a datetime can hold."""
    millis = getattr(record, "timestamp", None)
    if type(millis) is not int or millis < 0:
        return None
    try:
        return datetime.fromtimestamp(millis / 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return None


def record_size(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes]]
) -> int:
    """Bytes of a record's key, value and headers (names counted in characters), as far as
    they are what a record should hold; whatever is not is left to the decoder to report."""
    try:
        return (
            (len(key) if key is not None else 0)
            + (len(value) if value is not None else 0)
            + sum(len(name) + (len(raw) if raw is not None else 0) for name, raw in headers)
        )
    except (TypeError, ValueError):  # not sized, not pairs: the decoder says what is wrong
        return 0
