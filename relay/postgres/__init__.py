"""The relay's PostgreSQL backend: the writer API and the storage the relay engine uses."""

from outboxkit.relay.postgres.storage import PostgresOutboxStorage
from outboxkit.relay.postgres.writer import PostgresOutbox

__all__ = ["PostgresOutbox", "PostgresOutboxStorage"]
