"""The inbox worker's settings: one validated, frozen object (``OUTBOXKIT_*`` variables)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from outboxkit.core.settings import Duration, WorkerSettings


class InboxSettings(WorkerSettings):
    """Where to consume from, where to record effects, and how to treat bad input."""

    dlq_suffix: str = Field(
        default=".dlq",
        min_length=1,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="Dead-letter topic of a topic: <topic><suffix> (the topic must exist)",
    )
    dlq_idempotence: bool = Field(
        default=True,
        description="Write dead letters with an idempotent producer (no duplicates when a send is "
        "retried). Turn off only for brokers without idempotent producers (the Tansu demo broker)",
    )
    dlq_max_bytes: int = Field(
        default=1_000_000,
        ge=10_000,
        description="Largest dead letter written, in bytes as the producer counts them; a larger "
        "one is cut to fit and says so (the original stays in its topic). Keep it at or below "
        "the dead-letter topics' max.message.bytes",
    )
    max_record_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description="Largest record (key, value and headers) the worker decodes; a larger one "
        "is dead-lettered as too_large without being parsed. Bounds what one record can cost",
    )
    stall_after: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a partition may have records pending without progress before the "
        "worker reports it stalled (unhealthy)",
    )
    commit_interval: float = Field(
        default=0.2,
        gt=0,
        description="Seconds between Kafka offset commits (each only after its records' "
        "database transaction committed; a crash redelivers at most this much, absorbed)",
    )
    handler_attempts: int = Field(
        default=5,
        ge=1,
        description="Attempts of a raising handler before its event is dead-lettered",
    )
    inbox_retention: Duration = Field(
        default=timedelta(days=7),
        description="Keep dedupe records this long; a duplicate arriving later is processed "
        "again, so keep it longer than the relay's retention plus any replay window",
    )
    cleanup_interval: float = Field(default=60.0, gt=0, description="Seconds between cleanups")
    cleanup_batch: int = Field(default=1000, ge=1, description="Rows deleted per cleanup batch")
    transaction_batch: int = Field(
        default=500,
        ge=1,
        description="Records of one partition handled in one database transaction (one commit); "
        "each in a savepoint, so a failing handler only rolls back its own record",
    )
    max_records: int = Field(
        default=2000, ge=1, description="Records fetched per poll (over all partitions)"
    )
    pool_size: int = Field(default=8, ge=1, description="Database connections of the worker")
