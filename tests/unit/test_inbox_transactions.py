"""The inbox's store transactions (inbox/transactions.py) through their own interface,
``await runner.run(tp, deliveries, progress)``, on the in-memory store: a batch the database
aborts for outliving its time limit is split down to the record that does not fit, which is
dead-lettered after its attempts while the others take effect once (G8, G5); a raising handler
rolls back only its own delivery."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from aiokafka.structs import ConsumerRecord

from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox import BatchOutcome, Delivery, InMemoryInboxStore
from outboxkit.inbox.exceptions import InboxStorageUnavailableError, InboxTransactionTooLongError
from outboxkit.inbox.progress import PartitionProgress
from outboxkit.inbox.transactions import FIRST_OUTAGE_PAUSE, TransactionRunner, outage_pause
from tests.unit.inbox_fakes import TP, Charged, charging_inbox, metrics, record, settings


class TimeLimitedStore:
    """The in-memory store, but a transaction of more than ``fits`` deliveries, or one holding
    the order named ``slow``, outlives the database's time limit and is aborted whole."""

    def __init__(self, fits: int) -> None:
        self.store = InMemoryInboxStore()
        self.fits = fits
        self.sizes: list[int] = []

    async def process_batch(
        self, inbox: str, deliveries: Sequence[Delivery[MemoryTransaction]]
    ) -> BatchOutcome:
        self.sizes.append(len(deliveries))
        slow = any(getattr(d.event, "order", None) == "slow" for d in deliveries)
        if len(deliveries) > self.fits or slow:
            raise InboxTransactionTooLongError("aborted: it outlived the time limit")
        return await self.store.process_batch(inbox, deliveries)

    async def purge(self, older_than: timedelta, limit: int) -> int:
        return await self.store.purge(older_than, limit)

    async def count(self, inbox: str) -> int:
        return await self.store.count(inbox)


def _deliveries(events: list[Charged], first_offset: int = 0) -> list[Delivery[MemoryTransaction]]:
    inbox = charging_inbox()
    found = []
    for offset, event in enumerate(events, start=first_offset):
        consumed = record(offset, event)
        assert isinstance(consumed, ConsumerRecord)
        handler = inbox.handler_for(event)
        assert handler is not None
        found.append(Delivery(event, handler, TP.topic, TP.partition, offset, consumed))
    return found


class _DeadLetters:
    def __init__(self) -> None:
        self.letters: list[tuple[int, str, str]] = []

    async def __call__(
        self,
        record: ConsumerRecord[bytes, bytes],
        reason: str,
        error: BaseException,
        progress: PartitionProgress,
    ) -> None:
        self.letters.append((record.offset, reason, type(error).__name__))


async def _no_pause(seconds: float) -> None:
    return None


def _runner(store: object, dead_letters: _DeadLetters) -> TransactionRunner[MemoryTransaction]:
    return TransactionRunner(
        "payments",
        settings(),
        store,  # type: ignore[arg-type]
        metrics=metrics(),
        pause=_no_pause,
        dead_letter=dead_letters,
    )


async def test_a_batch_over_the_time_limit_is_split_and_only_the_slow_record_dead_lettered() -> (
    None
):
    """Would catch a too-long batch retried whole forever (a crash loop, G8), a split that loses
    or repeats records (G5), or the slow record never dead-lettered."""
    store, dead_letters = TimeLimitedStore(fits=2), _DeadLetters()
    runner = _runner(store, dead_letters)
    orders = ["a", "b", "c", "slow", "d", "e", "f", "g"]
    batch = _deliveries([Charged(order=o) for o in orders], first_offset=100)
    progress = PartitionProgress()

    await runner.run(TP, batch, progress)

    assert batch == []
    assert store.store.effects == [("charge", o) for o in orders if o != "slow"]
    assert dead_letters.letters == [(103, "handler_failed", "InboxTransactionTooLongError")]
    assert progress.offset == 108
    assert max(store.sizes[1:]) <= 4  # halved after the first abort
    assert runner.health.last_error is not None


async def test_a_raising_handler_rolls_back_only_its_own_delivery() -> None:
    """Would catch the deliveries before a failing one rolled back with it, the ones after it
    dropped, or the failing one retried without end instead of dead-lettered."""
    store, dead_letters = InMemoryInboxStore(), _DeadLetters()
    runner = _runner(store, dead_letters)
    events = [Charged(order=o) for o in ["a", "bad", "b"]]
    progress = PartitionProgress()

    await runner.run(TP, _deliveries(events), progress)

    assert store.effects == [("charge", "a"), ("charge", "b")]
    assert dead_letters.letters == [(1, "handler_failed", "ValueError")]
    assert progress.offset == 3
    # redelivered after a crash: absorbed, nothing runs twice, the failing one fails again
    again = PartitionProgress()
    await runner.run(TP, _deliveries(events), again)
    assert store.effects == [("charge", "a"), ("charge", "b")]
    assert [letter[0] for letter in dead_letters.letters] == [1, 1]
    assert again.offset == 3


class _Outage(InMemoryInboxStore):
    """The in-memory store, unavailable for its first ``failing`` transactions."""

    def __init__(self, failing: int) -> None:
        super().__init__()
        self.failing = failing

    async def process_batch(
        self, inbox: str, deliveries: Sequence[Delivery[MemoryTransaction]]
    ) -> BatchOutcome:
        if self.failing:
            self.failing -= 1
            raise InboxStorageUnavailableError("the database does not answer (fake)")
        return await super().process_batch(inbox, deliveries)


async def test_the_first_retry_after_an_outage_comes_at_once_and_the_pauses_grow_from_there() -> (
    None
):
    """The pause before retrying a transaction the database did not answer starts short and
    doubles, up to ``retry_backoff_max``: a try during an outage waits for a connection anyway,
    and the first try after the database answers must not sit out a fixed pause (before, every
    pause was ``retry_backoff_max``: 5 s by default, after the database was back)."""
    store, dead_letters = _Outage(failing=9), _DeadLetters()
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    runner = TransactionRunner(
        "payments",
        settings(retry_backoff_max=1.0),
        store,
        metrics=metrics(),
        pause=pause,
        dead_letter=dead_letters,
    )
    await runner.run(TP, _deliveries([Charged(order="a")]), PartitionProgress())

    assert pauses == [FIRST_OUTAGE_PAUSE * 2**n for n in range(5)] + [1.0] * 4
    assert pauses[0] <= 0.05
    assert store.effects == [("charge", "a")]
    assert runner.health.database_available
    assert outage_pause(1, 5.0) == FIRST_OUTAGE_PAUSE
