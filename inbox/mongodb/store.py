"""MongoDB implementation of :class:`~outboxkit.inbox.store.InboxStore`.

A dedupe record is ``{_id: {consumer, event_id}, expires_at, …}`` in ``outboxkit.inbox``,
inserted in the same multi-document transaction as the handler's writes, then committed; only
then does the worker commit the Kafka offset (guarantee G6). Two workers that take the same
event (a rebalance) both insert the same ``_id``: MongoDB lets one commit and aborts the other
with a write conflict, which retries the whole transaction and then finds the record.

Retries follow the driver's rules (:func:`outboxkit.core.mongodb.in_transaction`): a
``TransientTransactionError`` reruns the batch — its handlers' effects were rolled back, so
they take effect once — and an ``UnknownTransactionCommitResult`` retries only the commit,
which the server applies at most once. If the commit's fate stays unknown, the worker is told
the database is unavailable and handles the batch again later: the dedupe records then say
which events took effect.

MongoDB has no savepoints, so when a handler raises, the batch is redone one delivery per
transaction: exactly the deliveries before the failing one commit, as on PostgreSQL.

A transaction must fit mongod's ``transactionLifetimeLimitSeconds`` (read from the server, 60 s
when the user may not read it), past which mongod aborts it (``NoSuchTransaction``, labelled
transient: rerunning it would fail the same way, forever). A batch therefore commits what its
handlers did once they used a share of it (:mod:`outboxkit.inbox.budget`), and a transaction
aborted after running that long raises :class:`InboxTransactionTooLongError`, which the worker
answers by splitting the batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from bson import MinKey
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import OperationFailure

from outboxkit.core.mongodb import (
    MAJORITY_WRITE,
    Document,
    MongoConnection,
    collection,
    guarded,
    in_transaction,
    is_transient,
    is_unavailable,
)
from outboxkit.inbox.budget import CachedLimit, TransactionLimit
from outboxkit.inbox.exceptions import InboxStorageUnavailableError, InboxTransactionTooLongError
from outboxkit.inbox.store import BatchOutcome, Delivery, Indexed, handler_calls, run_calls

#: mongod's ``transactionLifetimeLimitSeconds`` unless it says otherwise.
DEFAULT_LIFETIME = 60.0


class _HandlerFailedError(Exception):
    """A handler of the batch raised ``error`` (which one, the batch redone one delivery per
    transaction tells)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"a handler failed: {error!r}")
        self.error = error


class MongoInboxStore(MongoConnection):
    """Use as ``async with MongoInboxStore(url) as store:``. ``retention``: how long a dedupe
    record counts; a duplicate arriving later takes effect again (keep it longer than any
    redelivery or replay window)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 10.0,
        retention: timedelta = timedelta(days=7),
        app_name: str = "outboxkit-inbox",
        read_timeout: float | None = None,
    ) -> None:
        super().__init__(
            url, connect_timeout=connect_timeout, app_name=app_name, read_timeout=read_timeout
        )
        self._records = collection(self.database, "inbox", write_concern=MAJORITY_WRITE)
        self.retention = retention
        self._limit = CachedLimit(self._read_limit)
        #: mongod's wall clock minus this process's (read with the limit, every 60 s).
        self._server_offset = timedelta(0)

    async def process_batch(
        self, inbox: str, deliveries: Sequence[Delivery[AsyncClientSession]]
    ) -> BatchOutcome:
        """As the protocol says; the batch stops growing once its handlers used their share of
        ``transactionLifetimeLimitSeconds`` (:mod:`outboxkit.inbox.budget`), and one mongod
        aborted for outliving it raises :class:`InboxTransactionTooLongError`."""
        try:
            return BatchOutcome(ran=await self._transact(inbox, deliveries))
        except _HandlerFailedError as failed:
            if len(deliveries) == 1:
                return BatchOutcome(failed=(0, failed.error))
        # Which delivery fails, and what commits before it: one transaction each.
        outcome = BatchOutcome()
        for index, delivery in enumerate(deliveries):
            try:
                [ran] = await self._transact(inbox, [delivery])
            except _HandlerFailedError as failed:
                outcome.failed = (index, failed.error)
                break
            except InboxTransactionTooLongError as exc:
                outcome.failed = (index, exc)  # alone, it does not fit: its handler's failure
                break
            outcome.ran.append(ran)
        return outcome

    async def _read_limit(self) -> TransactionLimit:
        await self._read_server_clock()
        try:
            reply = await guarded(
                self._client.admin.command(
                    {"getParameter": 1, "transactionLifetimeLimitSeconds": 1}
                ),
                InboxStorageUnavailableError,
            )
            seconds = float(reply["transactionLifetimeLimitSeconds"])
            name = f"MongoDB's transactionLifetimeLimitSeconds ({seconds:g} s)"
        except (OperationFailure, KeyError):  # not allowed to read it: mongod's default
            seconds = DEFAULT_LIFETIME
            name = f"MongoDB's transactionLifetimeLimitSeconds (assumed {seconds:g} s)"
        return TransactionLimit(lifetime=seconds, name=name)

    async def _read_server_clock(self) -> None:
        """How far mongod's wall clock is from this process's (``hello``'s ``localTime``, to
        the millisecond). A dedupe record's expiry is written and judged on the server's clock:
        a worker whose own clock is off, by any amount, never takes a live record for an
        expired one, nor writes one that expires early for the other workers (G6)."""
        before = datetime.now(UTC)
        reply = await guarded(self._client.admin.command("hello"), InboxStorageUnavailableError)
        after = datetime.now(UTC)
        server: datetime = reply["localTime"]  # naive: commands ignore the client's tz_aware
        self._server_offset = server.replace(tzinfo=UTC) - (before + (after - before) / 2)

    def _server_now(self) -> datetime:
        """mongod's wall clock now, as last measured (:meth:`_read_server_clock`)."""
        return datetime.now(UTC) + self._server_offset

    async def _transact(
        self, inbox: str, deliveries: Sequence[Delivery[AsyncClientSession]]
    ) -> list[bool]:
        limit = await self._limit.get()  # and the server's clock

        async def work(session: AsyncClientSession) -> list[bool]:
            deadline = limit.deadline(time.monotonic())
            now = self._server_now()
            ids = [{"consumer": inbox, "event_id": d.event.id} for d in deliveries]
            # An expired record no longer counts, whether or not mongod's TTL monitor (which
            # runs every 60 s) has removed it yet: what is a duplicate never depends on it.
            recorded = {
                doc["_id"]["event_id"]: doc["expires_at"]
                async for doc in self._records.find(
                    {"_id": {"$in": ids}}, {"expires_at": True}, session=session
                )
            }
            seen = {event_id for event_id, expires in recorded.items() if expires > now}
            expired = [i for i in ids if i["event_id"] in recorded.keys() - seen]
            if expired:
                await self._records.delete_many({"_id": {"$in": expired}}, session=session)
            ran: list[bool] = []
            new: list[Indexed[AsyncClientSession]] = []
            for index, delivery in enumerate(deliveries):
                first = delivery.event.id not in seen
                ran.append(first)
                if first:
                    seen.add(delivery.event.id)  # a second copy in the batch is a duplicate
                    new.append((index, delivery))
            try:
                done = await run_calls(
                    handler_calls(new), session, deadline=deadline, size=len(deliveries)
                )
            except Exception as exc:
                if is_transient(exc) or is_unavailable(exc):
                    raise  # not the handler's fault: retried, or the database is away
                raise _HandlerFailedError(exc) from exc
            records = [self._record(inbox, d, now) for index, d in new if index < done]
            if records:
                await self._records.insert_many(records, session=session)
            return ran[:done]

        return await in_transaction(
            self._client,
            work,
            unavailable=InboxStorageUnavailableError,
            too_long=lambda elapsed: InboxTransactionTooLongError(limit.message(elapsed)),
            lifetime=limit.lifetime,
        )

    def _record(
        self, inbox: str, delivery: Delivery[AsyncClientSession], now: datetime
    ) -> Document:
        """The dedupe record of ``delivery``'s event."""
        return {
            "_id": {"consumer": inbox, "event_id": delivery.event.id},
            "event_type": delivery.event.event_type,
            "topic": delivery.topic,
            "partition": delivery.partition,
            "offset": delivery.offset,
            "received_at": now,
            "expires_at": now + self.retention,
        }

    async def purge(self, older_than: timedelta, limit: int) -> int:
        # Each record carries its expiry (received + this store's retention, older_than, on the
        # server's clock); inbox_expires_ttl serves this read. mongod's TTL monitor deletes
        # them too.
        await self._limit.get()  # and the server's clock
        expired = await guarded(
            self._records.find({"expires_at": {"$lte": self._server_now()}}, {"_id": True})
            .limit(limit)
            .to_list(),
            InboxStorageUnavailableError,
        )
        if not expired:
            return 0
        result = await guarded(
            self._records.delete_many({"_id": {"$in": [doc["_id"] for doc in expired]}}),
            InboxStorageUnavailableError,
        )
        return int(result.deleted_count)

    async def ping(self) -> None:
        await guarded(self.database.command("ping"), InboxStorageUnavailableError)

    def unanswered_for(self) -> float | None:
        """None: pymongo finds a primary by itself; an outage shows in failed transactions."""
        return None

    async def count(self, inbox: str) -> int:
        # Embedded documents compare field by field, so this range is one consumer's slice of
        # the _id index.
        low = {"consumer": inbox, "event_id": MinKey()}
        high = {"consumer": inbox + "\0"}
        return await guarded(
            self._records.count_documents({"_id": {"$gte": low, "$lt": high}}),
            InboxStorageUnavailableError,
        )
