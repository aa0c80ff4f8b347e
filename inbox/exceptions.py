"""Errors of the inbox (Kafka → handler, effects once).

InboxError
├── HandlerRegistrationError   a handler declared for a non-Event or twice
├── InboxStorageUnavailableError   the database cannot be reached (retriable: pause, never DLQ)
├── InboxTransactionTooLongError   the database aborted a transaction that outlived its limit
└── DeadLetterError            a dead-letter topic cannot be read, or a replay is impossible
"""

from outboxkit.core.exceptions import OutboxkitError


class InboxError(OutboxkitError):
    """The inbox failed."""


class HandlerRegistrationError(InboxError):
    """A handler was registered wrongly."""


class InboxStorageUnavailableError(InboxError):
    """The inbox database cannot be reached; the consumer pauses and tries again."""

    retriable = True


class DeadLetterError(InboxError):
    """A dead-letter topic cannot be read or replayed as asked."""


class InboxTransactionTooLongError(InboxError):
    """The database aborted a transaction for outliving its time limit (MongoDB's
    ``transactionLifetimeLimitSeconds``, PostgreSQL's ``transaction_timeout`` or
    ``idle_in_transaction_session_timeout``). Not an outage: the worker splits the batch, and a
    single record that still does not fit counts as a failure of its handler."""
