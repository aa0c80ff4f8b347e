"""The relay's MongoDB backend: the writer API, the storage, the change-stream wake-ups and the
operator's repairs.

MongoDB needs a replica set (a single node is enough): multi-document transactions and change
streams exist only there. See docs/mongodb.md."""

from outboxkit.relay.mongodb.operations import MongoOutboxOperations
from outboxkit.relay.mongodb.storage import MongoOutboxStorage
from outboxkit.relay.mongodb.wakeups import MongoWakeups
from outboxkit.relay.mongodb.writer import MongoOutbox

__all__ = ["MongoOutbox", "MongoOutboxOperations", "MongoOutboxStorage", "MongoWakeups"]
