"""The inbox: consumes events and runs each handler's effects exactly once.

Declare handlers on an :class:`Inbox`; run them with :class:`InboxWorker` (or
``outboxkit inbox module:inbox``)."""

import typing

from outboxkit.core import lazy
from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox.deadletter_topic import (
    DeadLetter,
    DeadLetterReplay,
    ReplayTarget,
    read_dead_letters,
    replay_dead_letters,
    replay_targets,
    unique_dead_letters,
)
from outboxkit.inbox.exceptions import (
    DeadLetterError,
    HandlerRegistrationError,
    InboxError,
    InboxStorageUnavailableError,
    InboxTransactionTooLongError,
)
from outboxkit.inbox.handlers import Inbox
from outboxkit.inbox.memory import InMemoryInboxStore
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.settings import InboxSettings
from outboxkit.inbox.store import BatchOutcome, Delivery, InboxStore
from outboxkit.inbox.worker import InboxHealth, InboxWorker

if typing.TYPE_CHECKING:
    from outboxkit.inbox.mongodb import MongoInboxStore
    from outboxkit.inbox.postgres import PostgresInboxStore

#: The database backends, imported on first use: the engine needs neither driver, and a service
#: on PostgreSQL never loads pymongo (tests/unit/test_lazy_backends.py).
_BACKENDS = {
    "MongoInboxStore": "outboxkit.inbox.mongodb",
    "PostgresInboxStore": "outboxkit.inbox.postgres",
}


__getattr__ = lazy.lazy_exports(__name__, _BACKENDS)


__all__ = [
    "BatchOutcome",
    "DeadLetter",
    "DeadLetterError",
    "DeadLetterReplay",
    "Delivery",
    "HandlerRegistrationError",
    "InMemoryInboxStore",
    "Inbox",
    "InboxError",
    "InboxHealth",
    "InboxMetrics",
    "InboxSettings",
    "InboxStorageUnavailableError",
    "InboxStore",
    "InboxTransactionTooLongError",
    "InboxWorker",
    "MemoryTransaction",
    "MongoInboxStore",
    "PostgresInboxStore",
    "ReplayTarget",
    "read_dead_letters",
    "replay_dead_letters",
    "replay_targets",
    "unique_dead_letters",
]
