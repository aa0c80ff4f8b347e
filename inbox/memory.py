"""An in-memory :class:`~outboxkit.inbox.store.InboxStore`, for fast tests of the inbox engine
and of handlers, without a database.

It keeps the contract of the real stores: one dedupe record per (consumer, event id), the
handler's effects commit together with it or not at all, a raising handler rolls back only its
own delivery and the batch stops there, records expire after the retention. Handlers receive a
:class:`~outboxkit.core.memory.MemoryTransaction` and record their effects on it (events they
add to an in-memory outbox commit with them); :attr:`InMemoryInboxStore.effects` holds what
committed::

    inbox = Inbox[MemoryTransaction]("payments")

    @inbox.handler(OrderPlaced)
    async def charge(event: OrderPlaced, tx: MemoryTransaction) -> None:
        tx.record(("charge", event.order_id))

Not for production: nothing survives the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox.exceptions import InboxStorageUnavailableError
from outboxkit.inbox.store import BatchOutcome, Delivery


class InMemoryInboxStore:
    """``retention``: how long a dedupe record counts (a later duplicate runs again)."""

    def __init__(self, *, retention: timedelta = timedelta(days=7)) -> None:
        self.retention = retention
        #: (consumer, event id) → when it was recorded.
        self.records: dict[tuple[str, UUID], datetime] = {}
        #: What handlers recorded, in commit order.
        self.effects: list[object] = []
        #: While true, every call fails as a database outage would (for engine tests).
        self.unavailable = False

    async def process_batch(
        self, consumer: str, deliveries: Sequence[Delivery[MemoryTransaction]]
    ) -> BatchOutcome:
        self._check_available()
        outcome = BatchOutcome()
        now = datetime.now(UTC)
        for index, delivery in enumerate(deliveries):
            dedupe_key = (consumer, delivery.event.id)
            recorded = self.records.get(dedupe_key)
            if recorded is not None and recorded + self.retention > now:
                outcome.ran.append(False)
                continue
            tx = MemoryTransaction()
            try:
                await delivery.handler(delivery.event, tx)
            except Exception as exc:
                outcome.failed = (index, exc)
                break
            self.records[dedupe_key] = now
            self.effects.extend(tx.commit())
            outcome.ran.append(True)
        return outcome

    async def purge(self, older_than: timedelta, limit: int) -> int:
        self._check_available()
        cutoff = datetime.now(UTC) - older_than
        expired = [key for key, at in self.records.items() if at < cutoff][:limit]
        for key in expired:
            del self.records[key]
        return len(expired)

    async def count(self, consumer: str) -> int:
        self._check_available()
        return sum(1 for name, _ in self.records if name == consumer)

    def _check_available(self) -> None:
        if self.unavailable:
            raise InboxStorageUnavailableError("the in-memory store is set unavailable")
