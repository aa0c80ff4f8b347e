"""The inbox's PostgreSQL backend."""

from outboxkit.inbox.postgres.store import PostgresInboxStore

__all__ = ["PostgresInboxStore"]
