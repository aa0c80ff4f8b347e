"""Errors of the inbox (Kafka → handler, effects once).

InboxError
├── HandlerRegistrationError   a handler declared for a non-Event or twice
├── InboxStorageUnavailableError   the database cannot be reached (retriable: pause, never DLQ)
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
