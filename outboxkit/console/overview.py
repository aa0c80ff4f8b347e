"""The overview's figures: one read of everything (the relay group, the backlog, the inboxes'
lag) shared by every viewer for a refresh interval, and the history the chart draws.

A request never waits for a read once there is one: it gets the last read, and a read older
than a refresh starts a new one in the background (stale while revalidating), so the page
answers in the time it takes to render, whatever the backlog costs to count.

A read costs the database one backlog query (``storage.backlog()``, what ``outboxkit outbox
pending`` runs) and, only when a relay joined the group since the last read, one look at the
members' versions; Kafka answers the rest through clients kept open. A viewer who asks within
:attr:`Overview.fresh_for` of the last read gets it again (the page polls every
``console_refresh`` seconds, so one viewer still starts a read at each refresh, and many
viewers cost no more).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from outboxkit.console.settings import InboxView
from outboxkit.console.sources import Sources
from outboxkit.inbox.status import InboxStatus
from outboxkit.relay import (
    GroupStatus,
    MemberStatus,
    PartitionBacklog,
    PartitionStatus,
    RelayHealth,
    TopicPartition,
)

__all__ = ["InboxOverview", "Overview", "OverviewSnapshot", "Sample"]

logger = structlog.get_logger("outboxkit.console")

#: Seconds between two reads of the topics' partition counts (they change rarely).
COUNTS_EVERY = 60.0


@dataclass(frozen=True)
class Sample:
    """One point of the chart: when, the outbox's pending records, the inboxes' lag."""

    at: float
    backlog: int
    lag: int


@dataclass
class InboxOverview:
    view: InboxView
    status: InboxStatus | None = None
    error: str | None = None

    @property
    def lag(self) -> int:
        return sum(p.pending for p in self.status.partitions) if self.status else 0


@dataclass
class OverviewSnapshot:
    taken_at: datetime
    #: Seconds the read took.
    read_seconds: float
    relay: GroupStatus | None = None
    relay_error: str | None = None
    #: The backlog per partition, when no relay topics are set (else it is in ``relay``).
    backlog: list[PartitionBacklog] = field(default_factory=list)
    backlog_error: str | None = None
    #: A member's client id (its process key) → the outboxkit release it runs.
    versions: dict[str, str | None] = field(default_factory=dict)
    #: ``topic/partition`` → offsets per second its end moved since the read before.
    rates: dict[str, float] = field(default_factory=dict)
    inboxes: list[InboxOverview] = field(default_factory=list)
    #: The relay of the service that mounts the console, as its ``/healthz`` reports it.
    local: RelayHealth | None = None
    history: list[Sample] = field(default_factory=list)

    @property
    def pending(self) -> int:
        if self.relay is not None:
            return sum(p.pending or 0 for p in _partitions(self.relay))
        return sum(b.pending for b in self.backlog)

    @property
    def failed(self) -> int:
        if self.relay is not None:
            return sum(p.failed or 0 for p in _partitions(self.relay))
        return sum(b.failed for b in self.backlog)

    @property
    def lag(self) -> int:
        return sum(inbox.lag for inbox in self.inboxes)

    @property
    def oldest_pending_age(self) -> float:
        if self.relay is not None:
            return max((p.oldest_pending_age or 0.0 for p in _partitions(self.relay)), default=0.0)
        now = self.taken_at.timestamp()
        return max((b.age(now) for b in self.backlog), default=0.0)

    @property
    def rows(self) -> list[tuple[PartitionStatus, MemberStatus | None]]:
        """Every partition of the relay's topics with the member that owns it, in order."""
        if self.relay is None:
            return []
        rows: list[tuple[PartitionStatus, MemberStatus | None]] = [
            (p, m) for m in self.relay.members for p in m.partitions
        ]
        rows += [(p, None) for p in self.relay.unowned]
        return sorted(rows, key=lambda row: _order(row[0].partition))


def _order(partition: str) -> tuple[str, int]:
    topic, _, number = partition.rpartition("/")
    return topic, int(number) if number.isdigit() else -1


def _partitions(status: GroupStatus) -> list[PartitionStatus]:
    return [p for m in status.members for p in m.partitions] + list(status.unowned)


class Overview:
    """Reads the overview's figures at most once per :attr:`fresh_for` (see the module)."""

    def __init__(
        self,
        sources: Sources,
        *,
        refresh: float,
        history: float,
        local: Callable[[], RelayHealth | None] | None = None,
    ) -> None:
        self.sources = sources
        #: A read younger than this is served again.
        self.fresh_for = refresh * 0.8
        self._history_seconds = history
        self._local = local
        self._history: deque[Sample] = deque()
        self._snapshot: OverviewSnapshot | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[OverviewSnapshot] | None = None
        self._counts: dict[str, int] | None = None
        self._counts_at = 0.0
        self._versions: dict[str, str | None] = {}
        self._ends: tuple[float, dict[TopicPartition, int]] | None = None
        self._last_error: str | None = None
        #: How many reads were made (tests and the bench count them).
        self.reads = 0

    async def current(self) -> OverviewSnapshot:
        """The last read; when it is older than :attr:`fresh_for`, a new read starts (one at a
        time, shared) and the answer does not wait for it: the page shows the last figures at
        once, and the new ones at its next refresh. Only the very first request waits."""
        if self._snapshot is not None and time.monotonic() - self._read_at < self.fresh_for:
            return self._snapshot
        reading = self.refresh()
        if self._snapshot is not None:
            return self._snapshot
        # Shielded: a viewer who goes away does not cancel the read the others wait for.
        return await asyncio.shield(reading)

    def refresh(self) -> asyncio.Task[OverviewSnapshot]:
        """The read in progress, or a new one."""
        if self._reading is None:
            self._reading = asyncio.create_task(self._read(), name="outboxkit.console.overview")
            self._reading.add_done_callback(self._done)
        return self._reading

    async def settled(self) -> None:
        """Once the read in progress, if any, has ended (the tests and the bench wait so)."""
        if self._reading is not None:
            await asyncio.gather(asyncio.shield(self._reading), return_exceptions=True)

    def _done(self, task: asyncio.Task[OverviewSnapshot]) -> None:
        self._reading = None
        if not task.cancelled() and task.exception() is None:
            self._snapshot = task.result()
            self._read_at = time.monotonic()

    async def close(self) -> None:
        task, self._reading = self._reading, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _read(self) -> OverviewSnapshot:
        started = time.monotonic()
        self.reads += 1
        snapshot = OverviewSnapshot(taken_at=datetime.now(UTC), read_seconds=0.0)
        await asyncio.gather(self._read_relay(snapshot), self._read_inboxes(snapshot))
        snapshot.local = self._local() if self._local is not None else None
        now = time.time()
        self._history.append(Sample(now, snapshot.pending, snapshot.lag))
        while self._history and self._history[0].at < now - self._history_seconds:
            self._history.popleft()
        snapshot.history = list(self._history)
        snapshot.read_seconds = time.monotonic() - started
        return snapshot

    async def _read_relay(self, snapshot: OverviewSnapshot) -> None:
        try:
            reader = await self.sources.relay_reader()
            storage = await self.sources.storage()
            if reader is None:
                snapshot.backlog = await storage.backlog()
                return
            if self._counts is None or time.monotonic() - self._counts_at > COUNTS_EVERY:
                self._counts = await reader.partition_counts()
                self._counts_at = time.monotonic()
            counts = self._counts
            tps = [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]
            status, ends = await asyncio.gather(
                reader.read(storage, counts=counts, last_publish=False), reader.end_offsets(tps)
            )
        except Exception as exc:
            self._counts = None
            snapshot.relay_error = _describe(exc)
            if snapshot.relay_error != self._last_error:  # once, not at every refresh
                logger.warning(
                    "console: cannot read the relay's status", error=snapshot.relay_error
                )
            self._last_error = snapshot.relay_error
            return
        self._last_error = None
        snapshot.relay = status
        snapshot.rates = self._rates(ends)
        members = {m.client_id for m in status.members}
        if not members <= set(self._versions):
            try:
                self._versions = await storage.member_versions(status.group)
            except Exception as exc:
                logger.warning("console: cannot read the relays' versions", error=_describe(exc))
        snapshot.versions = dict(self._versions)

    def _rates(self, ends: dict[TopicPartition, int]) -> dict[str, float]:
        now = time.monotonic()
        rates: dict[str, float] = {}
        if self._ends is not None:
            before, previous = self._ends
            elapsed = now - before
            if elapsed > 0:
                for tp, end in ends.items():
                    if tp in previous:
                        rates[str(tp)] = max(end - previous[tp], 0) / elapsed
        self._ends = (now, ends)
        return rates

    async def _read_inboxes(self, snapshot: OverviewSnapshot) -> None:
        views = self.sources.inboxes
        snapshot.inboxes = [InboxOverview(view) for view in views]
        if not views:
            return
        try:
            reader = await self.sources.inbox_reader()
        except Exception as exc:
            for inbox in snapshot.inboxes:
                inbox.error = _describe(exc)
            return

        async def read(inbox: InboxOverview) -> None:
            try:
                inbox.status = await reader.read(
                    inbox.view.group,
                    inbox.view.topics,
                    stall_after=self.sources.settings.stall_after,
                )
            except Exception as exc:
                inbox.error = _describe(exc)

        await asyncio.gather(*(read(inbox) for inbox in snapshot.inboxes))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
