"""Prometheus metrics of an inbox worker."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


class InboxMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.consumed = Counter(
            "outboxkit_inbox_consumed", "Records consumed", ["inbox", "topic"], registry=reg
        )
        self.handled = Counter(
            "outboxkit_inbox_handled", "Events whose handler committed", ["inbox"], registry=reg
        )
        self.duplicates = Counter(
            "outboxkit_inbox_duplicates",
            "Events skipped because they took effect before",
            ["inbox"],
            registry=reg,
        )
        self.dead_lettered = Counter(
            "outboxkit_inbox_dead_lettered",
            "Records sent to the dead-letter topic",
            ["inbox", "reason"],
            registry=reg,
        )
        self.unknown_fields = Counter(
            "outboxkit_inbox_unknown_fields",
            "Events decoded with payload fields their model does not declare (ignored: a "
            "producer ahead of this consumer's model)",
            ["inbox", "type", "version"],
            registry=reg,
        )
        self.foreign_records = Counter(
            "outboxkit_inbox_foreign_records",
            "Events read in a form outboxkit does not write (another producer's CloudEvent), "
            "by how they differ: structured, derived_id, assumed_version, "
            "implied_content_type, record_time",
            ["inbox", "type", "form"],
            registry=reg,
        )
        self.handler_seconds = Histogram(
            "outboxkit_inbox_handler_seconds",
            "Time of the dedupe + handler transaction",
            ["inbox"],
            registry=reg,
        )
        self.lag = Gauge(
            "outboxkit_inbox_lag",
            "Records behind the end of the partition",
            ["inbox", "topic", "partition"],
            registry=reg,
        )
        self.dedupe_rows = Gauge(
            "outboxkit_inbox_dedupe_records", "Dedupe records kept", ["inbox"], registry=reg
        )
        self.cleaned = Counter(
            "outboxkit_inbox_cleanup_deleted", "Dedupe records deleted by TTL", registry=reg
        )
        self.unreadable = Counter(
            "outboxkit_inbox_unreadable_records",
            "Records the Kafka client could not read (dead-lettered with what was recovered)",
            ["inbox", "topic"],
            registry=reg,
        )
        self.dead_letter_failures = Counter(
            "outboxkit_inbox_dead_letter_failures",
            "Failed writes to a dead-letter topic, by error",
            ["inbox", "error"],
            registry=reg,
        )
        self.dead_letters_truncated = Counter(
            "outboxkit_inbox_dead_letters_truncated",
            "Dead letters cut to fit OUTBOXKIT_DLQ_MAX_BYTES (the original stays in its topic)",
            ["inbox"],
            registry=reg,
        )
        self.parked = Gauge(
            "outboxkit_inbox_parked",
            "1 while a partition is parked: a record could not be dead-lettered, for good",
            ["inbox", "topic", "partition"],
            registry=reg,
        )
        self.stalled = Gauge(
            "outboxkit_inbox_stalled",
            "1 while a partition has records pending and made no progress for "
            "OUTBOXKIT_STALL_AFTER seconds",
            ["inbox", "topic", "partition"],
            registry=reg,
        )
        self.stepped_aside = Gauge(
            "outboxkit_inbox_stepped_aside",
            "1 while the worker is out of its group because its database does not answer "
            "(OUTBOXKIT_STEP_ASIDE_AFTER): the other workers handle its partitions",
            ["inbox"],
            registry=reg,
        )
        self.storage_errors = Counter(
            "outboxkit_inbox_storage_errors",
            "Database unavailable: the worker paused and retried",
            ["inbox"],
            registry=reg,
        )
        self.splits = Counter(
            "outboxkit_inbox_transaction_splits",
            "Batches split because the database aborted their transaction for outliving its "
            "time limit",
            ["inbox"],
            registry=reg,
        )
