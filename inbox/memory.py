"""An in-memory :class:`~outboxkit.inbox.store.InboxStore`, for fast tests of the inbox engine
and of handlers, without a database.

It keeps the contract of the real stores: one dedupe record per (inbox, event id), the
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
from outboxkit.inbox.store import BatchOutcome, Delivery, Indexed, handler_calls, run_call


class InMemoryInboxStore:
    """``retention``: how long a dedupe record counts (a later duplicate runs again)."""

    def __init__(self, *, retention: timedelta = timedelta(days=7)) -> None:
        self.retention = retention
        #: (inbox, event id) → when it was recorded.
        self.records: dict[tuple[str, UUID], datetime] = {}
        #: What handlers recorded, in commit order.
        self.effects: list[object] = []
        #: While true, every call fails as a database outage would (for engine tests).
        self.unavailable = False

    async def process_batch(
        self, inbox: str, deliveries: Sequence[Delivery[MemoryTransaction]]
    ) -> BatchOutcome:
        self._check_available()
        now = datetime.now(UTC)
        ran: list[bool] = []
        new: list[Indexed[MemoryTransaction]] = []
        seen: set[UUID] = set()
        for index, delivery in enumerate(deliveries):
            recorded = self.records.get((inbox, delivery.event.id))
            first = delivery.event.id not in seen and (
                recorded is None or recorded + self.retention <= now
            )
            seen.add(delivery.event.id)  # a second copy in the batch is a duplicate
            ran.append(first)
            if first:
                new.append((index, delivery))
        for call in handler_calls(new):
            failed = await self._commit(inbox, call, now)
            if failed is not None and len(call) > 1:  # which one: one transaction each
                for item in call:
                    if (failed := await self._commit(inbox, [item], now)) is not None:
                        break
            if failed is not None:
                return BatchOutcome(ran=ran[: failed[0]], failed=failed)
        return BatchOutcome(ran=ran)

    async def _commit(
        self, inbox: str, call: Sequence[Indexed[MemoryTransaction]], now: datetime
    ) -> tuple[int, Exception] | None:
        """Run ``call`` in a transaction of its own and commit it with its dedupe records; a
        raising handler commits nothing and is returned with its first delivery's index."""
        tx = MemoryTransaction()
        try:
            await run_call(call, tx)
        except Exception as exc:
            return call[0][0], exc
        for _, delivery in call:
            self.records[inbox, delivery.event.id] = now
        self.effects.extend(tx.commit())
        return None

    async def purge(self, older_than: timedelta, limit: int) -> int:
        self._check_available()
        cutoff = datetime.now(UTC) - older_than
        expired = [key for key, at in self.records.items() if at < cutoff][:limit]
        for key in expired:
            del self.records[key]
        return len(expired)

    async def count(self, inbox: str) -> int:
        self._check_available()
        return sum(1 for name, _ in self.records if name == inbox)

    async def ping(self) -> None:
        self._check_available()

    def unanswered_for(self) -> float | None:
        return None  # memory always answers

    def _check_available(self) -> None:
        if self.unavailable:
            raise InboxStorageUnavailableError("the in-memory store is set unavailable")
