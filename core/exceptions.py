"""The root of every exception outboxkit raises.

    OutboxkitError
    ├── ConfigurationError              settings that cannot work; the message says what to fix
    │   └── MissingTopicsError          topics the settings name do not exist on Kafka
    ├── CoordinatorNotReadyError        Kafka's coordinator of a consumer group does not answer yet
    ├── TopicsNotDescribedError         Kafka will not describe topics to this client (an ACL)
    ├── KafkaClientMismatchError        the installed aiokafka lacks an internal outboxkit uses
    ├── outboxkit.schemas.SchemaError   events, registry, wire format
    ├── outboxkit.relay.RelayError      outbox → Kafka
    └── outboxkit.inbox.InboxError      Kafka → handler

Each error's docstring is its default message. ``retriable`` tells a retry loop whether trying
the same operation again may succeed.
"""

from __future__ import annotations

from collections.abc import Sequence


class OutboxkitError(Exception):
    """outboxkit failed."""

    retriable: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__ or type(self).__name__)


class ConfigurationError(OutboxkitError):
    """The configuration is invalid."""


class MissingTopicsError(ConfigurationError):
    """Topics do not exist on Kafka: create them with `outboxkit topics create`."""


class TopicsNotDescribedError(OutboxkitError):
    """Kafka will not describe topics to this client: it lacks DESCRIBE on them (READ, WRITE and
    ALTER imply DESCRIBE; CREATE does not, so a client may create topics it cannot see)."""

    def __init__(self, topics: Sequence[str], *, created: Sequence[str] = ()) -> None:
        #: The topics Kafka refused to describe.
        self.topics = list(topics)
        #: Of those, the ones this client has just created (``ensure_topics``).
        self.created = list(created)
        names = ", ".join(f"Topic:{topic}" for topic in self.topics)
        super().__init__(f"Kafka does not allow this client DESCRIBE on {names}")


class CoordinatorNotReadyError(OutboxkitError):
    """Kafka's coordinator of a consumer group is not ready yet: retry in a few seconds."""

    retriable = True


class KafkaClientMismatchError(OutboxkitError):
    """The installed aiokafka lacks an internal that outboxkit reaches for
    (outboxkit/core/kafka_internals.py): install the aiokafka version pyproject.toml allows."""
