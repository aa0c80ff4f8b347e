"""The inbox's MongoDB backend: dedupe records and handlers in one multi-document transaction."""

from outboxkit.inbox.mongodb.store import MongoInboxStore

__all__ = ["MongoInboxStore"]
