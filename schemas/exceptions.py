"""Errors of events, the registry and the wire format.

SchemaError
├── EventDefinitionError   an Event subclass is declared wrongly (raised at class creation)
├── RegistryError          a model cannot be registered
└── EventDecodeError       a Kafka record is not a known, valid event; ``reason`` says why
"""

from enum import StrEnum

from outboxkit.core.exceptions import OutboxkitError


class SchemaError(OutboxkitError):
    """The event schema or its wire format was misused."""


class EventDefinitionError(SchemaError):
    """The event class is declared incorrectly."""


class RegistryError(SchemaError):
    """The event model cannot be registered."""


class DecodeErrorReason(StrEnum):
    """Why a Kafka record could not be decoded; a consumer can route on it (skip, dead-letter…)."""

    MISSING_HEADER = "missing_header"
    """A required CloudEvents header (``ce_id``, ``ce_type``…) or ``content-type`` is absent."""
    INVALID_HEADER = "invalid_header"
    """A header is malformed: duplicated, not UTF-8, or its value is not acceptable."""
    INVALID_KEY = "invalid_key"
    """The record key is missing, empty or not UTF-8."""
    INVALID_VALUE = "invalid_value"
    """The record value is missing, not UTF-8, not JSON or not a JSON object."""
    UNKNOWN_TYPE = "unknown_type"
    """No model is registered for ``ce_type``."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """``ce_type`` is registered, but not with this ``ce_schemaversion``."""
    INVALID_PAYLOAD = "invalid_payload"
    """The registered model rejected the payload."""
    TOO_LARGE = "too_large"
    """The record is larger than the decoder was allowed to parse (its ``max_bytes``)."""


class EventDecodeError(SchemaError):
    """The Kafka record could not be decoded into an event."""

    def __init__(self, reason: DecodeErrorReason, message: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type["EventDecodeError"], tuple[DecodeErrorReason, str]]:
        return type(self), (self.reason, str(self))
