"""The seam between the inbox worker and a database."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, Protocol

from aiokafka.structs import ConsumerRecord

from outboxkit.inbox.handlers import TX, BatchHandler, Handler
from outboxkit.schemas import Event


@dataclass(frozen=True, slots=True)
class Delivery(Generic[TX]):
    """One decoded record to take effect for: the event, its handler and where it came from
    (``record``: the consumed record itself, which the worker dead-letters if the handler keeps
    failing; stores do not need it)."""

    event: Event
    handler: Handler[TX]
    topic: str
    partition: int
    offset: int
    record: ConsumerRecord[bytes, bytes] | None = None
    #: Its type's batch handler, if it has one (``handler`` then calls it with this event
    #: alone): a store may call it once for a run of such deliveries (:func:`handler_calls`).
    batch: BatchHandler[TX] | None = None


#: A delivery with its index in the batch.
Indexed = tuple[int, Delivery[TX]]


def handler_calls(deliveries: Sequence[Indexed[TX]]) -> list[list[Indexed[TX]]]:
    """``deliveries`` (new ones, in order) as the handler calls that take them effect:
    consecutive deliveries of one type that has a batch handler in one call, any other alone."""
    calls: list[list[Indexed[TX]]] = []
    for item in deliveries:
        if (
            calls
            and item[1].batch is not None
            and type(calls[-1][-1][1].event) is type(item[1].event)
        ):
            calls[-1].append(item)
        else:
            calls.append([item])
    return calls


async def run_call(call: Sequence[Indexed[TX]], tx: TX) -> None:
    """Run one call of :func:`handler_calls` in ``tx``."""
    first = call[0][1]
    if len(call) == 1 or first.batch is None:
        await first.handler(first.event, tx)
    else:
        await first.batch([delivery.event for _, delivery in call], tx)


async def run_calls(
    calls: Sequence[Sequence[Indexed[TX]]], tx: TX, *, deadline: float, size: int
) -> int:
    """Run ``calls`` (:func:`handler_calls` of a batch of ``size`` deliveries) in ``tx``, in
    order, until all ran or, with some left, ``deadline`` (:func:`time.monotonic`) passed:
    the index of the first delivery that did not run (``size`` when all did). What is left
    goes in the next transaction."""
    for number, call in enumerate(calls):
        await run_call(call, tx)
        if time.monotonic() >= deadline and number + 1 < len(calls):
            return calls[number + 1][0][0]
    return size


@dataclass(slots=True)
class BatchOutcome:
    """``ran[i]``: whether delivery i's handler ran (False: a duplicate, absorbed). The
    transaction committed exactly ``len(ran)`` deliveries. ``failed`` names the delivery whose
    handler raised (its effects were rolled back; the ones after it were not attempted)."""

    ran: list[bool] = field(default_factory=list)
    failed: tuple[int, Exception] | None = None


class InboxStore(Protocol[TX]):
    """Where an inbox records the events it took effect for, in transactions of type ``TX``
    (PostgreSQL, MongoDB, or in memory for unit tests)."""

    async def process_batch(self, inbox: str, deliveries: Sequence[Delivery[TX]]) -> BatchOutcome:
        """For each delivery in order: record (inbox, event id) unless recorded before (and
        not yet expired); if that was new, run its handler in the same transaction — or, for a
        run of new deliveries of a type with a batch handler (:attr:`Delivery.batch`), that
        handler once with their events (:func:`handler_calls`; calling each delivery's
        ``handler`` instead is correct too, only slower). Normally one transaction for the
        batch (one commit). A raising handler rolls back only its own
        delivery's effects: the batch stops there, and exactly the deliveries before it commit
        (PostgreSQL uses a savepoint per delivery; MongoDB, which has none, redoes them one per
        transaction). A database failure raises the store's unavailable error and commits
        nothing of what it did not report."""

    async def purge(self, older_than: timedelta, limit: int) -> int:
        """Delete at most ``limit`` dedupe records older than ``older_than``."""

    async def count(self, inbox: str) -> int:
        """Dedupe records of ``inbox`` (a metric)."""

    async def ping(self) -> None:
        """Return once the database answers; raise the store's unavailable error if it does
        not (a worker that left its group while its transactions failed asks before it
        rejoins)."""

    def unanswered_for(self) -> float | None:
        """Seconds since the store found its database not answering (a connection lost for
        the server's sake, and none made since), or None while it answers or the store cannot
        tell: the worker's health reports the outage from then on, before any transaction has
        failed for it, and until a new connection succeeds."""
