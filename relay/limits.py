"""What a writer refuses inside the caller's transaction, because the relay could never publish
it (guarantee G8): the caller's own transaction fails with :class:`EventTooLargeError` instead of
a record being parked later.

- A key of at most :data:`MAX_KEY_BYTES`: keys travel in every claim, every parked-key filter
  and every Kafka record, so they stay small (an id, not a document).
- A record — key, value and headers, measured as the relay's producer measures it — of at most
  :data:`MAX_RECORD_BYTES`: under the producer's ``max_request_size`` (1 MiB,
  ``relay/publisher.py``) with room for the request's own framing, and under Kafka's default
  ``max.message.bytes`` (1,048,588). A topic configured lower refuses larger records; the relay
  then parks them (``outboxkit outbox failed``). Writers take lower limits as arguments.

And what the relay holds: a claim reads records of a partition only while those before them
come to less than its share of ``max_claim_bytes`` (:func:`record_bytes`; the storages'
``settle_and_claim``).
"""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from outboxkit.relay.exceptions import EventTooLargeError
from outboxkit.relay.records import OutboxRecord
from outboxkit.schemas import EncodedEvent

MAX_KEY_BYTES = 4096
MAX_RECORD_BYTES = 1_000_000


def check_size(
    wire: EncodedEvent,
    event_id: object,
    *,
    max_key_bytes: int = MAX_KEY_BYTES,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> None:
    """Raise :class:`EventTooLargeError` for a record the relay could never publish."""
    if len(wire.key) > max_key_bytes:
        raise EventTooLargeError(
            f"event {event_id}: its key is {len(wire.key)} bytes, over the limit of "
            f"{max_key_bytes}: key events by an id. Roll back this transaction."
        )
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
        wire.key, wire.value, list(wire.headers)
    )
    if size > max_record_bytes:
        raise EventTooLargeError(
            f"event {event_id}: its Kafka record would be {size} bytes, over the limit of "
            f"{max_record_bytes} (what the relay's producer and a default topic accept): put "
            "large content elsewhere and send a reference. Roll back this transaction."
        )


def record_bytes(record: OutboxRecord) -> int:
    """What a record counts for in a claim's byte bound (``max_claim_bytes``): its key, value,
    header names (UTF-8) and header values — what it holds in the relay's memory, give or take
    Python's overhead. Every storage measures the same (PostgreSQL with octet_length, MongoDB
    with $binarySize and $strLenBytes), so the relay can tell a partition cut short."""
    size = len(record.key) + (0 if record.value is None else len(record.value))
    return size + sum(len(name.encode()) + len(value) for name, value in record.headers)
