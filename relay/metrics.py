"""Prometheus metrics of the relay. Alert on ``outboxkit_relay_oldest_pending_age_seconds``
(stuck partitions) and ``outboxkit_relay_failed_records`` (parked records); see docs/relay.md."""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from outboxkit.relay.records import PartitionBacklog

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30)

#: The stages of a relay cycle (``outboxkit_relay_stage_seconds{stage}``).
STAGES = {
    "wakeup": "from a writer's wake-up reaching the relay to the cycle that reads it",
    "pace": "waiting for batch_interval since the last cycle started (batching by time)",
    "claim": "the storage call: settle the last batch, read the partitions' heads",
    "settle": "the storage call between two batches of one claim: settle the first",
    "send": "begin, AddPartitionsToTxn and Produce until every record is acknowledged",
    "commit": "EndTxn (the broker then writes the commit markers)",
    "confirm": "proving membership before a producer starts",
    "fence": "initialising the transactional ids of earlier owners",
    "init": "starting the block's producer (InitProducerId)",
}


#: Records the storage held back for a cycle because an older record of their key was not
#: visible to its read (MongoDB's order barrier, relay/mongodb/barrier.py). Counted where the
#: storage sees it, so kept outside any registry and added to each RelayMetrics' registry.
ORDER_HOLDS = Counter(
    "outboxkit_relay_order_holds",
    "Records held back for a cycle: an older record of their key was not visible yet "
    "(per-key order barrier; expected to stay 0)",
    ["topic"],
    registry=None,
)


class RelayMetrics:
    """The relay's metrics in ``registry`` (the default registry unless one is given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.published = Counter(
            "outboxkit_relay_published",
            "Records published (acked by Kafka)",
            ["topic"],
            registry=reg,
        )
        self.publish_errors = Counter(
            "outboxkit_relay_publish_errors",
            "Failed publish attempts: rejected (the record), retriable (the broker), fenced, "
            "crashed (the block's worker failed unexpectedly and is restarted)",
            ["topic", "kind"],
            registry=reg,
        )
        self.parked = Counter(
            "outboxkit_relay_parked",
            "Records parked as failed after max attempts",
            ["topic"],
            registry=reg,
        )
        self.batches = Counter(
            "outboxkit_relay_batches", "Batches claimed and published", ["topic"], registry=reg
        )
        self.in_flight = Gauge(
            "outboxkit_relay_in_flight", "Records sent, not yet confirmed", registry=reg
        )
        self.owned_partitions = Gauge(
            "outboxkit_relay_owned_partitions", "Partitions this relay owns", registry=reg
        )
        self.stepped_aside = Gauge(
            "outboxkit_relay_stepped_aside",
            "1 while this relay is out of its group because it cannot read its database "
            "(OUTBOXKIT_STEP_ASIDE_AFTER): the other relays publish its partitions",
            registry=reg,
        )
        self.stuck_partitions = Gauge(
            "outboxkit_relay_stuck_partitions",
            "Partitions this relay holds whose records have waited, and whose block has made no "
            "progress while trying, for OUTBOXKIT_STEP_ASIDE_AFTER: it steps aside from them",
            registry=reg,
        )
        self.rebalances = Counter(
            "outboxkit_relay_rebalances", "Partition assignments received", registry=reg
        )
        self.departed_removed = Counter(
            "outboxkit_relay_departed_members_removed",
            "Dead relays this relay removed from the group (their database connections had ended) "
            "before their Kafka session timed out",
            registry=reg,
        )
        self.wakeups = Counter(
            "outboxkit_relay_wakeups",
            "Reasons a partition looked for work: notify (a writer), sweep (fallback timer), "
            "reconnect (listener came back)",
            ["reason"],
            registry=reg,
        )
        self.unannounced = Counter(
            "outboxkit_relay_unannounced_sweeps",
            "Sweeps of an idle block that found records no wake-up had announced (expected to "
            "stay near 0: writers wake an idle relay on commit)",
            ["topic"],
            registry=reg,
        )
        self.declarations_lost = Counter(
            "outboxkit_relay_declarations_lost",
            "Partitions whose idle declaration the database no longer had (a crash restart or "
            "a failover loses them), declared again",
            registry=reg,
        )
        self.wakeups_missed = Gauge(
            "outboxkit_relay_wakeups_missed",
            "1 while writers do not wake this relay (its idle declarations were lost, or its "
            "sweeps keep finding records no wake-up announced): it publishes on its sweep, "
            "every OUTBOXKIT_SWEEP_INTERVAL, instead of on commit",
            registry=reg,
        )
        self.latency = Histogram(
            "outboxkit_relay_commit_to_ack_seconds",
            "From the outbox row's insert to Kafka's acknowledgement (the transaction's commit)",
            ["topic"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.stage = Histogram(
            "outboxkit_relay_stage_seconds",
            "Time per stage of a relay cycle: " + "; ".join(f"{k}: {v}" for k, v in STAGES.items()),
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=reg,
        )
        self.backlog = Gauge(
            "outboxkit_relay_backlog", "Pending records", ["topic", "partition"], registry=reg
        )
        self.oldest_pending_age = Gauge(
            "outboxkit_relay_oldest_pending_age_seconds",
            "Age of the oldest pending record (0 when none)",
            ["topic", "partition"],
            registry=reg,
        )
        self.failed_records = Gauge(
            "outboxkit_relay_failed_records",
            "Records parked as failed, waiting for an operator",
            ["topic", "partition"],
            registry=reg,
        )
        with contextlib.suppress(ValueError):  # already in this registry
            reg.register(ORDER_HOLDS)
        self.order_holds = ORDER_HOLDS

    def observe_backlog(self, backlog: list[PartitionBacklog], now_ts: float) -> None:
        self.backlog.clear()
        self.oldest_pending_age.clear()
        self.failed_records.clear()
        for b in backlog:
            labels = (b.topic, str(b.partition))
            self.backlog.labels(*labels).set(b.pending)
            self.oldest_pending_age.labels(*labels).set(b.age(now_ts) if b.pending else 0.0)
            self.failed_records.labels(*labels).set(b.failed)
