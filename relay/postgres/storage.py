"""PostgreSQL implementation of :class:`~outboxkit.relay.storage.OutboxStorage`.

Queries run on a small connection pool in autocommit mode (each is one statement; none holds a
lock past its own execution). Notifications arrive on one dedicated session connection, and the
relay's presence (:mod:`.presence`) lives on another: never through a pooler in transaction
mode, where ``LISTEN`` and session-level advisory locks do not work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from outboxkit.core.postgres import connect_session
from outboxkit.core.sql import load_queries
from outboxkit.core.waiting import sleep_unless_cancelled
from outboxkit.relay.postgres.presence import PostgresPresence
from outboxkit.relay.postgres.statements import NamedStatements
from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    TopicPartition,
)

logger = logging.getLogger(__name__)

_QUERIES = load_queries("outboxkit.relay.postgres", "queries.sql")
#: The channel the outbox's trigger NOTIFYs (migration 0002's ``outboxkit.wake_relay()``; a
#: migration cannot change, so tests/unit/test_notify_channel.py holds the two together).
CHANNEL = "outboxkit_outbox"

#: The longest pause between two attempts of the listener to connect: a refused attempt costs
#: nothing, and until the listener is back the relay is woken only by its sweep.
_LISTEN_RETRY_MAX = 1.0

#: settle_and_claim reads a window of a partition's first pending rows, twice as many as it may
#: return and at least _SCAN_EXTRA more: with repeated keys near the head, a wider window still
#: fills the batch with distinct keys. Reading rows costs most of the statement's time (heap
#: visits): with 1000 keys over 6 partitions, twice the batch of 500 already finds every key of a
#: partition, and a wider one only adds reads (bench/results/relay.md, "Drain with few keys");
#: a small batch still looks _SCAN_EXTRA rows past itself.
_SCAN_FACTOR = 2
_SCAN_EXTRA = 150

#: With at least _SPLIT_AFTER records to settle (a backlog), settle_and_claim reads the partitions
#: in _CLAIM_STATEMENTS concurrent statements: one statement runs on one server core, and while the
#: relay claims, Kafka and the relay wait. Fewer records: one statement (less CPU per cycle).
_CLAIM_STATEMENTS = 2
_SPLIT_AFTER = 200
#: The claim's byte bound when there is none (the query always compares with one).
_NO_BYTE_BOUND = 2**62


class PostgresOutboxStorage(NamedStatements):
    """Use as ``async with PostgresOutboxStorage(url) as storage:``."""

    queries = _QUERIES

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        listen_check_interval: float = 5.0,
        application_name: str = "outboxkit-relay",
        read_timeout: float | None = None,
    ) -> None:
        self._url = url
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._listen_check_interval = listen_check_interval
        #: Per partition, the transaction-id horizon of the relay's last idle declaration.
        self._horizons: dict[TopicPartition, str] = {}
        self._application_name = application_name
        self._presence = PostgresPresence(
            url,
            application_name=application_name,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        super().__init__(
            url,
            pool_size=pool_size,
            connect_timeout=connect_timeout,
            name="outboxkit-relay",
            application_name=application_name,
            # The claim's best plan depends on how full the outbox is; a generic plan cached
            # while it was empty ran for minutes on the first backlog (queries.sql,
            # settle_and_claim).
            custom_plans=True,
            read_timeout=read_timeout,
        )

    async def _close_own_connections(self) -> None:
        await self._presence.close()

    # -- OutboxStorage ----------------------------------------------------------------------

    async def register_topics(self, partitions: Mapping[str, int]) -> None:
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.executemany(
                _QUERIES["register_topic"],
                [{"topic": t, "partitions": n} for t, n in sorted(partitions.items())],
            )

    async def settle_and_claim(
        self,
        tps: Collection[TopicPartition],
        limit: int,
        *,
        published: Sequence[OutboxRecord] = (),
        keep: bool = False,
        depth: int = 1,
        max_bytes: int | None = None,
    ) -> list[OutboxRecord]:
        ordered = sorted(tps, key=lambda tp: (tp.topic, tp.partition))
        # Under a backlog the partitions' reads split over concurrent statements, so that the
        # server reads them on several cores; else one statement (less CPU per cycle). Each
        # settles the published records of its own partitions (a record of no listed partition,
        # or a settle-only call, goes with the first).
        statements = _CLAIM_STATEMENTS if len(published) >= _SPLIT_AFTER else 1
        groups = [g for g in (ordered[i::statements] for i in range(statements)) if g] or [ordered]
        group_of = {(tp.topic, tp.partition): i for i, g in enumerate(groups) for tp in g}
        settle: list[list[Any]] = [[] for _ in groups]
        for record in published:
            settle[group_of.get((record.topic, record.partition), 0)].append(record.id)
        claims = [
            self._claim(g, ids, limit, keep, depth=depth, max_bytes=max_bytes)
            for g, ids in zip(groups, settle, strict=True)
        ]
        parts = await asyncio.gather(*claims) if len(claims) > 1 else [await claims[0]]
        rows = [row for part in parts for row in part]
        return [
            OutboxRecord(  # positional: the claim's hot loop
                rid,
                topic,
                partition,
                key,
                value,
                tuple(zip(names, values, strict=True)),
                event_id,
                attempts,
                created_at,
            )
            for (
                rid,
                topic,
                partition,
                key,
                value,
                names,
                values,
                event_id,
                attempts,
                created_at,
            ) in rows
        ]

    async def _claim(
        self,
        ordered: Sequence[TopicPartition],
        published: list[Any],
        limit: int,
        keep: bool,
        *,
        depth: int,
        max_bytes: int | None,
    ) -> list[TupleRow]:
        params = {
            "published": published,
            "topics": [tp.topic for tp in ordered],
            "partitions": [tp.partition for tp in ordered],
            "limit": limit,
            "scan": max(limit * _SCAN_FACTOR, limit + _SCAN_EXTRA),
            "keep": keep,
            "depth": depth,
            "max_bytes": _NO_BYTE_BOUND if max_bytes is None else max_bytes,
        }
        # Rows come back in binary: the headers' arrays, the uuid and the timestamp load with
        # less of the relay's CPU than from text (bench/results/relay.md, "Drain with few keys").
        return await self._fetch("settle_and_claim", params, binary=True)

    async def record_failure(self, record: OutboxRecord, error: str, *, give_up: bool) -> None:
        await self._execute(
            "record_failure", {"id": record.id, "error": error[:4000], "give_up": give_up}
        )

    async def set_waiting(self, tps: Collection[TopicPartition], waiting: bool) -> int:
        if not tps:
            return 0
        params = {"topics": [tp.topic for tp in tps], "partitions": [tp.partition for tp in tps]}
        changed = await self._execute("set_waiting" if waiting else "clear_waiting", params)
        if waiting and changed:
            # A separate statement: its snapshot is taken after the declaration committed.
            # Declared already (a check at the sweep): no writer can have missed it.
            [(horizon,)] = await self._fetch("writers_horizon", {})
            for tp in tps:
                self._horizons[tp] = str(horizon)
        return changed

    async def earlier_writers_ended(self, tps: Collection[TopicPartition]) -> bool:
        horizons = {self._horizons[tp] for tp in tps if tp in self._horizons}
        if not horizons:
            return True
        # Horizons only grow: the latest one covers the others.
        horizon = max(horizons, key=int)
        [(ended,)] = await self._fetch("earlier_writers_ended", {"horizon": horizon})
        return bool(ended)

    async def wakeups(self) -> AsyncIterator[TopicPartition | None]:
        """Notifications from writers. After every (re)connect it yields ``None`` first:
        notifications sent while the listener was away are lost, so everything is re-read."""
        delay = 0.1
        while True:
            try:
                conn = await connect_session(
                    self._url,
                    application_name=f"{self._application_name}-listener",
                    connect_timeout=self._connect_timeout,
                    read_timeout=self._read_timeout,
                )
            except psycopg.OperationalError as exc:
                logger.warning("listener cannot connect, retrying in %.1f s: %s", delay, exc)
                await sleep_unless_cancelled(delay)
                delay = min(delay * 2, _LISTEN_RETRY_MAX)
                continue
            delay = 0.1
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    yield None
                    while True:
                        async for notify in conn.notifies(timeout=self._listen_check_interval):
                            yield _parse(notify.payload)
                        # Quiet for a while: make sure the session is still alive.
                        await conn.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                logger.warning("listener connection lost, reconnecting: %s", exc)

    async def announce_member(self, group: str, member_id: str) -> None:
        await self._presence.announce(group, member_id)

    async def departed_members(self, group: str, own_member_id: str) -> list[str]:
        return await self._presence.departed(group, own_member_id)

    async def forget_members(self, group: str, member_ids: list[str]) -> None:
        await self._presence.forget(group, member_ids)

    async def member_versions(self, group: str) -> dict[str, str | None]:
        rows = await self._fetch("member_versions", {"group": group})
        return dict(rows)

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        return await self._execute("purge_published", {"older_than": older_than, "limit": limit})

    async def backlog(self) -> list[PartitionBacklog]:
        rows = await self._fetch("backlog", {})
        return [
            PartitionBacklog(
                t, p, pending, oldest, failed, None if age is None else max(float(age), 0.0)
            )
            for t, p, pending, oldest, failed, age in rows
        ]


def _parse(payload: str) -> TopicPartition | None:
    topic, _, partition = payload.rpartition("/")
    return TopicPartition(topic, int(partition)) if topic and partition.isdigit() else None
