"""The relay: publishes committed outbox records to Kafka.

Service side: :class:`PostgresOutbox` adds events inside the caller's transaction.
Worker side: :class:`Relay` publishes the partitions its consumer-group member owns.
"""

from outboxkit.relay.engine import PartitionStatus, Relay, RelayHealth
from outboxkit.relay.exceptions import (
    NotInTransactionError,
    OwnershipLostError,
    RelayError,
    StorageUnavailableError,
    UnknownTopicError,
)
from outboxkit.relay.memory import InMemoryOutboxStorage
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.postgres import PostgresOutbox, PostgresOutboxStorage
from outboxkit.relay.records import OutboxRecord, PartitionBacklog, RecordInfo, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.status import GroupStatus, MemberStatus, group_status
from outboxkit.relay.storage import OutboxStorage, WakeupSource

__all__ = [
    "GroupStatus",
    "InMemoryOutboxStorage",
    "MemberStatus",
    "NotInTransactionError",
    "OutboxRecord",
    "OutboxStorage",
    "OwnershipLostError",
    "PartitionBacklog",
    "PartitionStatus",
    "PostgresOutbox",
    "PostgresOutboxStorage",
    "RecordInfo",
    "Relay",
    "RelayError",
    "RelayHealth",
    "RelayMetrics",
    "RelaySettings",
    "StorageUnavailableError",
    "TopicPartition",
    "UnknownTopicError",
    "WakeupSource",
    "group_status",
]
