"""Errors of the inbox (Kafka → handler, effects once)."""

from outboxkit.exceptions import OutboxkitError


class InboxError(OutboxkitError):
    """The inbox failed."""
