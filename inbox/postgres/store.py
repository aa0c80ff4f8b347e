"""PostgreSQL implementation of :class:`~outboxkit.inbox.store.InboxStore`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg

from outboxkit.core.postgres import PooledStore
from outboxkit.core.sql import load_queries
from outboxkit.inbox.budget import CachedLimit, TransactionLimit
from outboxkit.inbox.exceptions import InboxStorageUnavailableError, InboxTransactionTooLongError
from outboxkit.inbox.store import BatchOutcome, Delivery, Indexed, handler_calls, run_calls

_QUERIES = load_queries("outboxkit.inbox.postgres", "queries.sql")

#: PostgreSQL ended the session for outliving transaction_timeout (17+) or for a silence longer
#: than idle_in_transaction_session_timeout.
_ENDED_FOR_TIME = frozenset({"25P03", "25P04"})

#: What no handler's failure is: the connection (or the whole session) is gone. A statement
#: cancelled by statement_timeout (QueryCanceled, an OperationalError) is not among them.
_NOT_THE_HANDLERS = (
    psycopg.errors.IdleInTransactionSessionTimeout,
    psycopg.errors.TransactionTimeout,
    psycopg.OperationalError,
)


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _handlers_fault(exc: BaseException) -> bool:
    """A handler raised, or its statement was cancelled (statement_timeout), rather than the
    connection or the session being lost."""
    if any(isinstance(e, psycopg.errors.QueryCanceled) for e in _causes(exc)):
        return True
    return not isinstance(exc, (*_NOT_THE_HANDLERS, InboxStorageUnavailableError))


def _ended_for_time(exc: BaseException) -> bool:
    return any(getattr(e, "sqlstate", None) in _ENDED_FOR_TIME for e in _causes(exc))


def _session_lost(exc: BaseException) -> bool:
    """The server closed the connection (as it does past its time limits, when the pipeline
    gives no reason), rather than refused a statement."""
    return any(
        isinstance(e, psycopg.OperationalError) and not isinstance(e, psycopg.errors.QueryCanceled)
        for e in _causes(exc)
    )


class PostgresInboxStore(PooledStore):
    """Use as ``async with PostgresInboxStore(url) as store:``.

    A transaction must fit the server's ``transaction_timeout`` and
    ``idle_in_transaction_session_timeout`` where set (PostgreSQL ends the session past them): a
    batch commits what its handlers did once they used a share of ``transaction_timeout``
    (:mod:`outboxkit.inbox.budget`), and a session ended for outliving either raises
    :class:`InboxTransactionTooLongError`, which the worker answers by splitting the batch. A
    handler's statement cancelled by ``statement_timeout`` is that handler's failure."""

    unavailable = InboxStorageUnavailableError

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
    ) -> None:
        super().__init__(
            url,
            pool_size=pool_size,
            connect_timeout=connect_timeout,
            name="outboxkit-inbox",
            read_timeout=read_timeout,
        )
        self._limit = CachedLimit(self._read_limit)

    async def process_batch(self, inbox: str, deliveries: Sequence[Delivery]) -> BatchOutcome:
        """Optimistically: one statement inserts the whole batch's dedupe records, then the new
        events' handlers run without savepoints, their statements pipelined (no round trip
        each), and one commit. If a handler raises, that transaction rolls back and the batch is
        redone with a savepoint per delivery, which gives the exact prefix that commits and the
        delivery that failed."""
        limit = await self._limit.get()
        began: list[float] = []  # when the transaction began (after waiting for a connection)
        try:
            if len(deliveries) > 1:
                try:
                    return await self._process_optimistically(inbox, deliveries, limit, began)
                except Exception as exc:
                    if not _handlers_fault(exc):
                        raise  # the connection or the transaction is gone: nothing committed
                    began.clear()  # a handler raised: find out which, below
            return await self._process_with_savepoints(inbox, deliveries, limit, began)
        except (*_NOT_THE_HANDLERS, InboxStorageUnavailableError) as exc:
            elapsed = time.monotonic() - began[-1] if began else 0.0
            if _ended_for_time(exc) or (limit.outlived(elapsed) and _session_lost(exc)):
                raise InboxTransactionTooLongError(limit.message(elapsed)) from exc
            raise

    async def _process_optimistically(
        self,
        inbox: str,
        deliveries: Sequence[Delivery],
        limit: TransactionLimit,
        began: list[float],
    ) -> BatchOutcome:
        # Pipeline mode throughout: BEGIN and the dedupe records go in one round trip, the handlers'
        # statements are sent without waiting for each result, and COMMIT follows them; an error
        # surfaces at the latest when the pipeline syncs, before the transaction commits.
        ids = [str(d.event.id) for d in deliveries]
        async with self._connection() as conn, conn.pipeline(), conn.transaction():
            began.append(time.monotonic())
            deadline = limit.deadline(began[-1])
            cur = await conn.execute(*_dedupe_batch(inbox, deliveries, ids))
            new_ids = {row[0] for row in await cur.fetchall()}
            ran = []
            new: list[Indexed[psycopg.AsyncConnection[Any]]] = []
            for index, (d, event_id) in enumerate(zip(deliveries, ids, strict=True)):
                first = event_id in new_ids
                if first:
                    new_ids.discard(event_id)  # a second copy in the batch is a duplicate
                    new.append((index, d))
                ran.append(first)
            done = await run_calls(
                handler_calls(new), conn, deadline=deadline, size=len(deliveries)
            )
            unrun = [ids[index] for index, _ in new if index >= done]
            if unrun:  # recorded, not run: take their dedupe records back
                params = {"consumer": inbox, "event_ids": "{" + ",".join(unrun) + "}"}
                await conn.execute(_QUERIES["delete_dedupe_records"], params)
        return BatchOutcome(ran=ran[:done])

    async def _process_with_savepoints(
        self,
        inbox: str,
        deliveries: Sequence[Delivery],
        limit: TransactionLimit,
        began: list[float],
    ) -> BatchOutcome:
        outcome = BatchOutcome()
        async with self._connection() as conn, conn.transaction():
            began.append(time.monotonic())
            deadline = limit.deadline(began[-1])
            for index, d in enumerate(deliveries):
                try:
                    async with conn.transaction():  # a savepoint per delivery
                        cur = await conn.execute(
                            _QUERIES["insert_dedupe_record"], _dedupe_params(inbox, d)
                        )
                        if cur.rowcount:
                            await d.handler(d.event, conn)
                except psycopg.errors.QueryCanceled as exc:
                    outcome.failed = (index, exc)  # statement_timeout: the handler's statement
                    break
                except _NOT_THE_HANDLERS:
                    raise  # the connection or the transaction is gone: nothing committed
                except Exception as exc:
                    outcome.failed = (index, exc)
                    break
                outcome.ran.append(bool(cur.rowcount))
                if time.monotonic() >= deadline:
                    break  # commit what ran; the rest goes in the next transaction
        return outcome

    async def _read_limit(self) -> TransactionLimit:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["session_limits"])
            settings = {name: ms / 1000 for name, ms in await cur.fetchall() if ms > 0}
        lifetime = settings.get("transaction_timeout")
        idle = settings.get("idle_in_transaction_session_timeout")
        names = [f"{name} ({seconds:g} s)" for name, seconds in sorted(settings.items())]
        return TransactionLimit(
            lifetime=lifetime, idle=idle, name="PostgreSQL's " + " or ".join(names)
        )

    async def purge(self, older_than: timedelta, limit: int) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["purge"], {"older_than": older_than, "limit": limit})
            return cur.rowcount

    async def count(self, inbox: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(_QUERIES["count"], {"consumer": inbox})
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    async def ping(self) -> None:
        async with self._connection() as conn:
            await conn.execute(_QUERIES["ping"])


def _dedupe_params(inbox: str, d: Delivery) -> dict[str, object]:
    return {
        "consumer": inbox,
        "event_id": d.event.id,
        "event_type": d.event.event_type,
        "topic": d.topic,
        "partition": d.partition,
        "offset": d.offset,
    }


def _dedupe_batch(
    inbox: str, deliveries: Sequence[Delivery], ids: Sequence[str]
) -> tuple[str, dict[str, object]]:
    """The statement inserting the dedupe records of ``deliveries`` (whose event ids are
    ``ids``, as text) and its parameters. The columns go as array literals (one text parameter
    each, which PostgreSQL parses) rather than Python lists (which psycopg adapts element by
    element)."""
    first = deliveries[0]
    params: dict[str, object] = {
        "consumer": inbox,
        "event_ids": "{" + ",".join(ids) + "}",
        "event_types": _text_array([d.event.event_type for d in deliveries]),
        "offsets": "{" + ",".join([str(d.offset) for d in deliveries]) + "}",
    }
    if all(d.partition == first.partition and d.topic == first.topic for d in deliveries):
        params.update(topic=first.topic, partition=first.partition)
        return _QUERIES["insert_partition_dedupe_records"], params
    params.update(
        topics=_text_array([d.topic for d in deliveries]),
        partitions="{" + ",".join([str(d.partition) for d in deliveries]) + "}",
    )
    return _QUERIES["insert_dedupe_records"], params


def _text_array(values: Sequence[str]) -> str:
    """A PostgreSQL array literal of ``values``: each element quoted, ``\\`` and ``"`` escaped."""
    return "{" + ",".join(['"' + _escape(v) + '"' for v in values]) + "}"


def _escape(value: str) -> str:
    if "\\" not in value and '"' not in value:
        return value
    return value.replace("\\", "\\\\").replace('"', '\\"')
