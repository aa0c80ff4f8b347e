"""Errors of the relay (outbox → Kafka)."""

from outboxkit.exceptions import OutboxkitError


class RelayError(OutboxkitError):
    """The relay failed."""
