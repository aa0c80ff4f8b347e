"""What the relay reads from an outbox and what it reports about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from uuid import UUID

RecordState = Literal["pending", "failed", "published"]


@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One outbox record, ready to publish without decoding: bytes in, bytes out."""

    #: The record's identity in its backend (PostgreSQL: the row id; MongoDB: the document
    #: ``_id``). Opaque to the engine, which only hands it back to the storage.
    id: object
    topic: str
    partition: int
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    event_id: UUID
    attempts: int = 0
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """An outbox row as operators see it (``outboxkit outbox pending|failed``)."""

    event_id: UUID
    event_type: str
    topic: str
    partition: int
    key: bytes
    state: RecordState
    attempts: int
    created_at: datetime
    last_error: str | None = None
    published_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PartitionBacklog:
    """Pending rows of one partition and how old the oldest is (for metrics and alerts)."""

    topic: str
    partition: int
    pending: int
    oldest_created_at: datetime | None
    failed: int = 0
    #: Seconds the oldest pending record has waited, on the database's clock; None when the
    #: storage does not say (then :meth:`age` uses this process's clock).
    oldest_age: float | None = None

    def age(self, now: float) -> float:
        """Seconds the oldest pending record has waited (0 with none pending): the database's
        measure, or else ``now`` (this process's wall clock) minus its creation."""
        if self.oldest_age is not None:
            return self.oldest_age
        if self.oldest_created_at is None:
            return 0.0
        return max(now - self.oldest_created_at.timestamp(), 0.0)


@dataclass(slots=True)
class PublishOutcome:
    """What one publish attempt of a batch achieved."""

    published: list[OutboxRecord] = field(default_factory=list)
    #: Records the broker will never accept, with the error (counted against their attempts).
    rejected: list[tuple[OutboxRecord, str]] = field(default_factory=list)
    #: The broker refused a record batch of several records for one of them: which one, only
    #: publishing them again one record per record batch (``alone``) tells.
    refused_batch: bool = False
