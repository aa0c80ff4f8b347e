"""What a relay reports about itself: ``/healthz``, ``outboxkit relay status``.

:class:`RelayHealth` is assembled by :meth:`Relay.health <outboxkit.relay.engine.Relay.health>`
from its parts: the partitions it owns and their workers
(:class:`~outboxkit.relay.reconciler.PartitionReconciler`), the last backlog measured
(:class:`~outboxkit.relay.side_tasks.BacklogMonitor`) and the progress and errors its workers
report (:class:`Progress`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from outboxkit.relay.publisher import describe
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.worker import BlockWorker

__all__ = ["PartitionStatus", "Progress", "RelayHealth", "partition_statuses"]


@dataclass
class PartitionStatus:
    """One owned partition, as ``/healthz`` and ``outboxkit relay status`` show it."""

    partition: str
    #: The block (one Kafka transaction per batch) that publishes it, e.g. ``orders/0-7``.
    block: str
    pending: int | None = None
    failed: int | None = None
    oldest_pending_age: float | None = None
    #: When a record of it was last acknowledged by Kafka (ISO 8601, UTC).
    last_publish_at: str | None = None
    fenced: bool = False


@dataclass
class RelayHealth:
    """What a liveness/readiness probe reports. ``healthy`` is false when the relay is not
    running, an owned partition has had pending records for longer than ``stall_after``, a
    worker crashed, the group coordinator has not answered for two session timeouts
    (``membership_lapsed_for``), or the backlog could not be read for ``stall_after``
    (``database_unreadable_for``), or it has left its group because it cannot read its database
    (``stepped_aside_for``), or it holds partitions it cannot publish (``stuck``)."""

    running: bool
    owned: list[str]
    stalled: list[str]
    seconds_since_progress: float | None
    last_error: str | None
    #: Owned per the group, but another relay's producer fenced ours (a rebalance is coming).
    fenced: list[str] = field(default_factory=list)
    #: This relay's consumer-group member id (``outboxkit relay status`` lists every member).
    member_id: str | None = None
    partitions: list[PartitionStatus] = field(default_factory=list)
    #: Owned partitions whose worker failed unexpectedly and waits to be restarted.
    crashed: list[str] = field(default_factory=list)
    #: Seconds the group coordinator has not answered this relay, once two session timeouts or
    #: more: the group has given its partitions to others, and it publishes none until it
    #: rejoins (a half-open link to Kafka). None while the membership holds.
    membership_lapsed_for: float | None = None
    #: Seconds every backlog measure has failed, once longer than ``stall_after``: the database
    #: does not answer this relay (cut, or a half-open link), so its partitions wait, unseen.
    database_unreadable_for: float | None = None
    #: Seconds this relay has been out of its group because it could not read its database
    #: for ``step_aside_after``: the other relays publish its partitions until it rejoins.
    stepped_aside_for: float | None = None
    #: Seconds writers have not been waking this relay (its idle declarations were lost, or
    #: its sweeps keep finding records no wake-up announced): it publishes everything, but on
    #: its sweep, up to ``sweep_interval`` late, instead of on commit. Degraded, not unhealthy.
    wakeups_missed_for: float | None = None
    #: Owned partitions whose records have waited, and whose block has made no progress while
    #: trying, for ``step_aside_after``: the relay steps aside from them
    #: (:mod:`outboxkit.relay.stuck`).
    stuck: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return (
            self.running
            and not self.stalled
            and not self.crashed
            and self.membership_lapsed_for is None
            and self.database_unreadable_for is None
            and self.stepped_aside_for is None
            and not self.stuck
        )


class Progress:
    """When a worker last published, and the last error any reported."""

    def __init__(self) -> None:
        self._last_progress: float | None = None
        self.last_error: str | None = None

    def progressed(self) -> None:
        self._last_progress = time.monotonic()

    def failed(self, error: BaseException) -> None:
        self.last_error = describe(error)

    @property
    def seconds_since_progress(self) -> float | None:
        if self._last_progress is None:
            return None
        return time.monotonic() - self._last_progress


def partition_statuses(
    owned: Iterable[TopicPartition],
    worker_of: Callable[[TopicPartition], BlockWorker | None],
    backlog: Mapping[TopicPartition, PartitionBacklog] | None,
) -> list[PartitionStatus]:
    """Each of ``owned``, with its block, fence and last publish from its worker and, once
    the backlog has been measured (``backlog`` not None), its pending and failed counts."""
    now = time.time()
    statuses = []
    for tp in sorted(owned, key=lambda t: (t.topic, t.partition)):
        worker = worker_of(tp)
        status = PartitionStatus(str(tp), str(worker.block) if worker else "")
        if backlog is not None:
            measured = backlog.get(tp)
            status.pending = measured.pending if measured else 0
            status.failed = measured.failed if measured else 0
            status.oldest_pending_age = (
                round(measured.age(now), 3) if measured and measured.pending else 0.0
            )
        if worker is not None:
            status.fenced = worker.fenced
            published = worker.last_publish.get(tp)
            if published is not None:
                status.last_publish_at = datetime.fromtimestamp(published, UTC).isoformat()
        statuses.append(status)
    return statuses
