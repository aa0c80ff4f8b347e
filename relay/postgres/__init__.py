"""The relay's PostgreSQL backend: the writer API, the storage the relay engine uses and the
operator's repairs."""

from outboxkit.relay.postgres.operations import PostgresOutboxOperations
from outboxkit.relay.postgres.storage import PostgresOutboxStorage
from outboxkit.relay.postgres.writer import PostgresOutbox

__all__ = ["PostgresOutbox", "PostgresOutboxOperations", "PostgresOutboxStorage"]
