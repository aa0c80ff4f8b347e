"""The root of every exception outboxkit raises.

    OutboxkitError
    ├── ConfigurationError              settings that cannot work; the message says what to fix
    │   └── MissingTopicsError          topics the settings name do not exist on Kafka
    ├── CoordinatorNotReadyError        Kafka's coordinator of a consumer group does not answer yet
    ├── outboxkit.schemas.SchemaError   events, registry, wire format
    ├── outboxkit.relay.RelayError      outbox → Kafka
    └── outboxkit.inbox.InboxError      Kafka → handler

Each error's docstring is its default message. ``retriable`` tells a retry loop whether trying
the same operation again may succeed.
"""


class OutboxkitError(Exception):
    """outboxkit failed."""

    retriable: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__ or type(self).__name__)


class ConfigurationError(OutboxkitError):
    """The configuration is invalid."""


class MissingTopicsError(ConfigurationError):
    """Topics do not exist on Kafka: create them with `outboxkit topics create`."""


class CoordinatorNotReadyError(OutboxkitError):
    """Kafka's coordinator of a consumer group is not ready yet: retry in a few seconds."""

    retriable = True
