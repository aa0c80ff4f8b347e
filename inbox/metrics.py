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
        self.storage_errors = Counter(
            "outboxkit_inbox_storage_errors",
            "Database unavailable: the worker paused and retried",
            ["inbox"],
            registry=reg,
        )
