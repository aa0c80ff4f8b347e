"""The seam between the inbox consumer and a database."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from aiokafka.structs import ConsumerRecord

from outboxkit.inbox.handlers import Handler
from outboxkit.schemas import Event


@dataclass(frozen=True, slots=True)
class Delivery:
    """One decoded record to take effect for: the event, its handler and where it came from
    (``record``: the consumed record itself, which the worker dead-letters if the handler keeps
    failing; stores do not need it)."""

    event: Event
    handler: Handler
    topic: str
    partition: int
    offset: int
    record: ConsumerRecord[bytes, bytes] | None = None


@dataclass(slots=True)
class BatchOutcome:
    """``ran[i]``: whether delivery i's handler ran (False: a duplicate, absorbed). The
    transaction committed exactly ``len(ran)`` deliveries. ``failed`` names the delivery whose
    handler raised (its effects were rolled back; the ones after it were not attempted)."""

    ran: list[bool] = field(default_factory=list)
    failed: tuple[int, Exception] | None = None


class InboxStore(Protocol):
    async def process_batch(self, consumer: str, deliveries: Sequence[Delivery]) -> BatchOutcome:
        """In **one** transaction (one commit, one fsync), for each delivery: record (consumer,
        event id); if that was new, run its handler. Each delivery has a savepoint: a raising
        handler rolls back only its own delivery, and the batch stops there and commits what
        came before. A database failure raises and commits nothing."""

    async def purge(self, older_than: timedelta, limit: int) -> int:
        """Delete at most ``limit`` dedupe records older than ``older_than``."""

    async def count(self, consumer: str) -> int:
        """Dedupe records of ``consumer`` (a metric)."""
