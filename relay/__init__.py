"""The relay: publishes committed outbox records to Kafka.

Service side: :class:`PostgresOutbox` / :class:`MongoOutbox` add events inside the caller's
transaction.
Worker side: :class:`Relay` publishes the partitions its consumer-group member owns.
"""

import typing

from outboxkit.core import lazy
from outboxkit.relay.batches import by_depth, first_per_key
from outboxkit.relay.engine import PartitionStatus, Relay, RelayHealth
from outboxkit.relay.exceptions import (
    EventTooLargeError,
    NotInTransactionError,
    OwnershipLostError,
    RelayError,
    StorageUnavailableError,
    UnknownTopicError,
)
from outboxkit.relay.limits import record_bytes
from outboxkit.relay.memory import InMemoryOutbox, InMemoryOutboxOperations, InMemoryOutboxStorage
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    RecordInfo,
    RecordState,
    TopicPartition,
)
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.status import GroupStatus, MemberStatus, group_status
from outboxkit.relay.storage import OutboxOperations, OutboxStorage, OutboxWriter, WakeupSource

if typing.TYPE_CHECKING:
    from outboxkit.relay.mongodb import (
        MongoOutbox,
        MongoOutboxOperations,
        MongoOutboxStorage,
        MongoWakeups,
    )
    from outboxkit.relay.postgres import (
        PostgresOutbox,
        PostgresOutboxOperations,
        PostgresOutboxStorage,
    )

#: The database backends, imported on first use: the engine needs neither driver, and a service
#: on PostgreSQL never loads pymongo (tests/unit/test_lazy_backends.py).
_BACKENDS = {
    "MongoOutbox": "outboxkit.relay.mongodb",
    "MongoOutboxOperations": "outboxkit.relay.mongodb",
    "MongoOutboxStorage": "outboxkit.relay.mongodb",
    "MongoWakeups": "outboxkit.relay.mongodb",
    "PostgresOutbox": "outboxkit.relay.postgres",
    "PostgresOutboxOperations": "outboxkit.relay.postgres",
    "PostgresOutboxStorage": "outboxkit.relay.postgres",
}


__getattr__ = lazy.lazy_exports(__name__, _BACKENDS)


__all__ = [
    "EventTooLargeError",
    "GroupStatus",
    "InMemoryOutbox",
    "InMemoryOutboxOperations",
    "InMemoryOutboxStorage",
    "MemberStatus",
    "MongoOutbox",
    "MongoOutboxOperations",
    "MongoOutboxStorage",
    "MongoWakeups",
    "NotInTransactionError",
    "OutboxOperations",
    "OutboxRecord",
    "OutboxStorage",
    "OutboxWriter",
    "OwnershipLostError",
    "PartitionBacklog",
    "PartitionStatus",
    "PostgresOutbox",
    "PostgresOutboxOperations",
    "PostgresOutboxStorage",
    "RecordInfo",
    "RecordState",
    "Relay",
    "RelayError",
    "RelayHealth",
    "RelayMetrics",
    "RelaySettings",
    "StorageUnavailableError",
    "TopicPartition",
    "UnknownTopicError",
    "WakeupSource",
    "by_depth",
    "first_per_key",
    "group_status",
    "record_bytes",
]
