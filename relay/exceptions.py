"""Errors of the relay (outbox → Kafka).

RelayError
├── NotInTransactionError   the writer was handed a connection with no transaction
├── UnknownTopicError       the writer wrote to a topic the relay has not registered
├── EventTooLargeError      the writer refused an event the relay could never publish
├── OwnershipLostError      Kafka fenced this relay's producer: another relay owns the partition
└── StorageUnavailableError the database cannot be reached (retriable)
"""

from outboxkit.core.exceptions import OutboxkitError


class RelayError(OutboxkitError):
    """The relay failed."""


class NotInTransactionError(RelayError):
    """Outbox writes need the caller's open transaction: use `async with conn.transaction():`."""


class UnknownTopicError(RelayError):
    """The topic is not registered in outboxkit.topics."""


class EventTooLargeError(RelayError):
    """An event whose key or Kafka record is over the writer's limit (relay/limits.py)."""


class OwnershipLostError(RelayError):
    """Another relay took over this partition; this one must stop publishing it."""

    retriable = False


class StorageUnavailableError(RelayError):
    """The outbox database cannot be reached; the relay waits and tries again."""

    retriable = True
