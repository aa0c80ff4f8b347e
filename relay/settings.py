"""The relay's settings: one validated, frozen object (``OUTBOXKIT_*`` environment variables)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from outboxkit.core.settings import Duration, WorkerSettings


class RelaySettings(WorkerSettings):
    """Where to read the outbox from, where to publish it, and how."""

    relay_name: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Relay name: its consumer group is outboxkit.relay.<name>; relays of one "
        "outbox share the name",
    )
    transactional: bool = Field(
        default=True,
        description="Publish in Kafka transactions with a transactional.id per partition, which "
        "fences a stale (zombie) relay. Turn off only for brokers without transactions (the "
        "Tansu demo broker): a zombie could then reorder a key (guarantee G4)",
    )
    batch_size: int = Field(
        default=500, ge=1, le=10_000, description="Records per partition per Kafka transaction"
    )
    claim_depth: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Records of one key a claim reads at most. They go out one per key per "
        "Kafka transaction (the per-key barrier), each transaction settled in the database "
        "before the next, so a backlog with few keys needs a claim per this many transactions, "
        "not one per transaction",
    )
    max_claim_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="Bytes (keys, values, headers) of records one claim reads at most, shared "
        "by the partitions it reads; a partition always gets its first record, so a large one "
        "still moves. The default is what a full claim of 1 KB records holds anyway (batch size "
        "500 x claim depth 4 x 32 partitions): it cuts only claims of large records (each up to "
        "1 MB, the writers' limit), which used to hold up to batch size x claim depth of them "
        "per partition",
    )
    partitions_per_transaction: int = Field(
        default=32,
        ge=1,
        le=32,
        description="Most partitions one Kafka transaction covers (a power of two). A relay "
        "publishes the partitions it owns in aligned blocks of up to this many, one transaction "
        "per block and batch: fewer transactions cost the broker and the relay less. 1 is one "
        "transaction per partition",
    )
    batch_interval: float = Field(
        default=0.005,
        ge=0,
        le=1.0,
        description="Seconds between the starts of two small batches of one block: records "
        "committed meanwhile go in the next batch, so batches grow with the load instead of "
        "each record costing a Kafka transaction. A backlog is drained without waiting. Lower "
        "means lower latency under load and more CPU per record; an idle relay sends at once",
    )
    instance_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="A stable name for this relay instance (e.g. a StatefulSet pod name): "
        "static consumer-group membership (Kafka group.instance.id). A restarted instance takes "
        "its partitions back without a rebalance; a stopped one keeps them until "
        "OUTBOXKIT_SESSION_TIMEOUT. Unset: dynamic membership",
    )
    departed_check_interval: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between a relay's checks for relays of its group that died: a "
        "dead relay's database connections end at once, and the relay that sees it removes it "
        "from the consumer group instead of everyone waiting for OUTBOXKIT_SESSION_TIMEOUT "
        "(MongoDB: needs the inprog privilege, e.g. clusterMonitor). 0 turns the check off; it "
        "is off with OUTBOXKIT_INSTANCE_ID, whose member keeps its place while it restarts",
    )
    max_in_flight: int = Field(
        default=1000, ge=1, description="Records sent and not yet confirmed, over all partitions"
    )
    transaction_timeout: float = Field(
        default=10.0,
        ge=1.0,
        description="Seconds before the broker aborts a transaction of a frozen relay (while it "
        "is open, read_committed consumers of that partition wait)",
    )
    sweep_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between fallback reads of an idle partition (wake-ups are hints)",
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        description="Attempts before a record the broker rejects is parked as failed",
    )
    publish_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a batch may take to be acknowledged before the relay discards the "
        "producer and retries with a fresh one",
    )
    retention: Duration | None = Field(
        default=None,
        description="Keep published records this long (for replay) instead of deleting them",
    )
    cleanup_interval: float = Field(
        default=30.0, gt=0, description="Seconds between retention cleanups"
    )
    cleanup_batch: int = Field(default=1000, ge=1, description="Rows deleted per cleanup batch")
    revoke_timeout: float = Field(
        default=20.0,
        gt=0,
        description="Seconds a relay waits for in-flight records when a partition is revoked",
    )
    metrics_interval: float = Field(
        default=10.0, gt=0, description="Seconds between backlog measurements"
    )
    stall_after: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a pending record may wait before the health probe reports its "
        "partition as stalled",
    )
    slow_after: float = Field(
        default=5.0,
        gt=0,
        description="Seconds after which a claim, send or commit still running is logged as "
        "slow, with its partitions and stage",
    )
    pool_size: int = Field(default=4, ge=1, description="Database connections of the relay")

    @model_validator(mode="after")
    def _relay_coherent(self) -> Self:
        if self.partitions_per_transaction & (self.partitions_per_transaction - 1):
            raise ValueError("OUTBOXKIT_PARTITIONS_PER_TRANSACTION must be a power of two")
        return self

    @property
    def group_id(self) -> str:
        return f"outboxkit.relay.{self.relay_name}"

    @property
    def max_block_level(self) -> int:
        """Blocks span at most ``2**max_block_level`` partitions."""
        return self.partitions_per_transaction.bit_length() - 1
