"""The inbox's offset committer: what may be committed to Kafka, and when.

A partition's offset is the next record to handle; the delivery path moves it only once a
record's database transaction committed (or the record was absorbed or dead-lettered), so what
this module commits is always what the database already has (G6): a crash before a commit
redelivers records whose dedupe rows absorb them. It commits every ``commit_interval`` (when an
offset moved, and every partition's every :data:`STATUS_REFRESH` seconds to refresh the progress
metadata, :mod:`outboxkit.inbox.progress`), on revocation after the poll in progress finished
(:class:`CommitOnRevoke`), and once more when the worker leaves. Past the last record of a
caught-up partition it moves the offset over transaction markers and aborted records, which a
``read_committed`` consumer never receives, so that lag and commits do not stay one behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

import structlog
from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from outboxkit.core.waiting import sleep_unless_cancelled
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.progress import PartitionProgress, is_stalled
from outboxkit.inbox.settings import InboxSettings

logger = structlog.get_logger("outboxkit.inbox")

#: Seconds between commits that refresh every partition's progress metadata, moved or not.
STATUS_REFRESH = 5.0


class OffsetConsumer(Protocol):
    """What the committer needs of the Kafka consumer (:class:`~outboxkit.inbox.kafka.
    InboxConsumer` in production)."""

    def assignment(self) -> set[TopicPartition]: ...

    def last_stable_offset(self, tp: TopicPartition) -> int | None: ...

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None: ...

    async def past_invisible(self, tp: TopicPartition, handled: int) -> int | None: ...


class OffsetCommitter:
    """Holds each assigned partition's :class:`PartitionProgress` and commits its offset to
    ``consumer``'s group, for inbox ``inbox``. A partition with records pending and no progress
    for ``settings.stall_after`` counts as stalled (a metric here, the health in the worker)."""

    def __init__(
        self,
        consumer: OffsetConsumer,
        settings: InboxSettings,
        *,
        inbox: str,
        metrics: InboxMetrics,
    ) -> None:
        self._consumer = consumer
        self._stall_after = settings.stall_after
        self._inbox = inbox
        self._metrics = metrics
        #: Each assigned partition's progress (the delivery path moves its offset).
        self.partitions: dict[TopicPartition, PartitionProgress] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._lock = asyncio.Lock()
        self._last_refresh = 0.0
        self._log = logger.bind(inbox=inbox)

    def partition(self, tp: TopicPartition) -> PartitionProgress:
        """The progress of ``tp``, new if the partition was not seen yet."""
        return self.partitions.setdefault(tp, PartitionProgress())

    def forget(self, revoked: set[TopicPartition]) -> None:
        """Drop revoked partitions: their next owner starts from their last commit. Their
        gauges here read 0: the next owner exports them now (a dashboard's max over workers
        would otherwise show the lag this worker last saw, for good)."""
        for tp in revoked:
            self.partitions.pop(tp, None)
            self._committed.pop(tp, None)
            labels = (self._inbox, tp.topic, str(tp.partition))
            self._metrics.parked.labels(*labels).set(0)
            self._metrics.stalled.labels(*labels).set(0)
            self._metrics.lag.labels(*labels).set(0)

    async def skip_invisible(self) -> None:
        """Move each caught-up partition's offset past the transaction markers (and aborted
        records) after its last record (:meth:`InboxConsumer.past_invisible`)."""
        for tp, progress in list(self.partitions.items()):
            if progress.parked is None and progress.offset is not None:
                position = await self._consumer.past_invisible(tp, progress.offset)
                if position is not None:
                    progress.advance(position)

    async def commit_regularly(self, interval: float) -> None:
        """Commit every ``interval`` seconds, until cancelled."""
        while True:
            await sleep_unless_cancelled(interval)
            await self.commit()

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit each partition's offset — what the database committed — when it moved, and
        every partition's (with its progress metadata) every :data:`STATUS_REFRESH` seconds.
        With ``only``, every partition of ``only`` (a revocation, leaving the group). A failed
        commit is logged: the partitions' next owner re-reads from the last commit."""
        async with self._lock:
            now = time.time()
            refresh = now - self._last_refresh >= STATUS_REFRESH
            pending = self.pending()
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            for tp, progress in list(self.partitions.items()):
                if (only is not None and tp not in only) or progress.offset is None:
                    continue
                if pending.get(tp) == 0:
                    progress.progress_at = now  # nothing to do counts as keeping up
                stalled = progress.parked is None and is_stalled(
                    pending.get(tp), progress.progress_at, self._stall_after, now
                )
                labels = (self._inbox, tp.topic, str(tp.partition))
                self._metrics.stalled.labels(*labels).set(int(stalled))
                if refresh or only is not None or progress.offset != self._committed.get(tp):
                    offsets[tp] = OffsetAndMetadata(progress.offset, progress.metadata())
            if not offsets:
                return
            try:
                await self._consumer.commit(offsets)
            except (CommitFailedError, KafkaError) as exc:
                # A rebalance took the partitions: their next owner re-reads from the last commit
                # and the dedupe rows absorb what this worker already did.
                self._log.warning("offset commit failed", error=repr(exc))
                return
            for tp, committed in offsets.items():
                self._committed[tp] = committed.offset
            if refresh and only is None:
                self._last_refresh = now

    def pending(self) -> dict[TopicPartition, int]:
        """Records pending per assigned partition: its end (last stable offset) past the next
        record to handle, as of the last fetch."""
        assigned = self._consumer.assignment()
        pending: dict[TopicPartition, int] = {}
        for tp, progress in self.partitions.items():
            if tp not in assigned:
                continue
            end = self._consumer.last_stable_offset(tp)
            if end is not None and progress.offset is not None:
                pending[tp] = max(end - progress.offset, 0)
                self._metrics.lag.labels(self._inbox, tp.topic, str(tp.partition)).set(pending[tp])
        return pending


class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """On revocation wait for the poll in progress (``idle`` set), then commit what it
    finished and forget the partitions. Never raises (aiokafka would swallow it): a failure only
    means redeliveries, which dedupe absorbs."""

    def __init__(self, committer: OffsetCommitter, idle: asyncio.Event) -> None:
        self._committer = committer
        self._idle = idle

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        try:
            await self._idle.wait()
            await self._committer.commit(only=set(revoked))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("committing on revocation failed")
        finally:
            self._committer.forget(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._committer.partition(tp)
