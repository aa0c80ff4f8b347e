"""The one seam between the relay benchmark and a database: :class:`BenchOutbox`.

Every phase that needs an outbox (drain, latency, idle, churn) goes through it: create the
schema, register a topic, write events the way a service does (the product's writer, one
transaction each), keep a backlog aside and make it visible in one commit, count what is pending,
and tell when the relays are idle. :class:`PostgresBenchOutbox` is the PostgreSQL one;
``outbox_mongodb.MongoBenchOutbox`` (``--database mongodb``) implements the same protocol. The
``writer`` and ``claims`` phases measure PostgreSQL itself (pgbench, WAL) and use the PostgreSQL
class directly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, LiteralString, Protocol
from urllib.parse import urlsplit

import psycopg

from bench.relay_bench.harness import DRAIN_TOPIC, SEQ_PLACEHOLDER, SOURCE, make_event, say
from outboxkit.migrations.postgres import migrate
from outboxkit.relay import PostgresOutbox, PostgresOutboxStorage
from outboxkit.schemas import Event

OUTBOX_COLUMNS = "topic, partition, key, value, header_names, header_values, event_id, event_type"
BENCH_DB = "outboxkit_bench"


def q(text: str) -> LiteralString:
    """A query built here from constants (table names); psycopg's types want a literal."""
    return text


class Writer(Protocol):
    """A service's connection: one event per transaction, committed when ``write`` returns."""

    async def write(self, event: Event) -> None: ...

    async def close(self) -> None: ...


class BenchOutbox(Protocol):
    #: What relays get as OUTBOXKIT_DATABASE_URL.
    url: str

    async def prepare(self) -> None:
        """A fresh, migrated database."""

    async def register_topic(self, topic: str, partitions: int) -> None: ...

    async def seed(self, rows: int, keys: int, topic: str) -> float:
        """Write ``rows`` events with the product's writer (batched), keep them aside for
        :meth:`load_backlog`, leave the outbox empty; return the write rate (rows/s). Each kept
        event's ``seq`` is its place among its key's events in the order the relays must
        publish them (``harness.with_seq``)."""

    async def load_backlog(self, rows: int) -> float:
        """Make ``rows`` of the seed pending (one commit wakes idle relays); return the
        ``time.perf_counter()`` of the first commit, from when relays can drain."""

    async def clear(self) -> None:
        """No pending records, no relay declared waiting."""

    async def pending(self) -> int: ...

    async def pending_by_partition(self, topic: str) -> dict[int, int]: ...

    async def states(self, event_ids: Sequence[str]) -> dict[str, str]:
        """Each of ``event_ids`` still in the outbox: ``<state> p<partition> attempts <n>``."""

    async def relays_idle(self, topic: str, partitions: int) -> bool:
        """Whether every partition's relay has declared itself waiting (idle, woken by writers)."""

    async def writers(self, count: int) -> list[Writer]: ...

    async def diagnostics(self, topic: str) -> str:
        """What the database is doing now (when a partition stops moving)."""

    async def close(self) -> None:
        """Release what the object holds open (the bench ends)."""


#: The drain's backlog is written in transactions of SEED_CHUNK events by SEED_WRITERS
#: connections at once, with the product's writer (``add_many``).
SEED_CHUNK, SEED_WRITERS = 5000, 2

#: Writes a list of events in one transaction of its own connection.
WriteMany = Callable[[list[Event]], Awaitable[None]]


async def fill(rows: int, keys: int, topic: str, writers: Sequence[WriteMany]) -> float:
    """``rows`` events of ``keys`` keys written by ``writers`` in parallel, SEED_CHUNK per
    transaction; return the seconds it took."""
    rng = random.Random(11)
    chunks = iter(range(0, rows, SEED_CHUNK))

    async def write(writer: WriteMany) -> None:
        for done in chunks:
            await writer(
                [make_event(rng, keys, topic) for _ in range(min(SEED_CHUNK, rows - done))]
            )

    start = time.perf_counter()
    await asyncio.gather(*(write(w) for w in writers))
    return time.perf_counter() - start


#: The seed: the outbox's rows in id order, the order :func:`load_backlog` inserts them in one
#: transaction. That commit is the backlog's, and within it a key's rows commit in insertion
#: order; so a row's ``seq`` is its rank among its key's rows by id, written into its value (its
#: writer put ``"seq":0}`` at the end; ``harness.with_seq`` does the same on MongoDB).
_SEED_SELECT = (
    "SELECT id AS seq, topic, partition, key, convert_to(regexp_replace(convert_from(value, "
    "'UTF8'), '\"seq\":0\\}$', '\"seq\":' || (row_number() OVER (PARTITION BY topic, key "
    "ORDER BY id) - 1) || '}'), 'UTF8') AS value, header_names, header_values, event_id, "
    "event_type FROM outboxkit.outbox ORDER BY id"
)


def seeded(rows: int, elapsed: float, distinct: int, what: str) -> float:
    """Say how the backlog was written; return its rate (rows/s)."""
    say(
        f"backlog: {rows:,} {what} ({SEED_CHUNK}/transaction, {SEED_WRITERS} connections) in "
        f"{elapsed:.1f} s = {rows / elapsed:,.0f} rows/s; {distinct} distinct keys"
    )
    return rows / elapsed


class _PgWriter:
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self._outbox = PostgresOutbox(source=SOURCE)

    async def write(self, event: Event) -> None:
        async with self._conn.transaction():
            await self._outbox.add(self._conn, event)

    async def close(self) -> None:
        await self._conn.close()


class PostgresBenchOutbox:
    def __init__(self, admin_url: str, dbname: str = BENCH_DB) -> None:
        self.admin_url = admin_url
        self.url = urlsplit(admin_url)._replace(path=f"/{dbname}").geturl()
        self.dbname = dbname
        self._seeded = 0

    async def connect(self, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self.url, autocommit=autocommit, application_name="outboxkit-bench"
        )

    async def scalar(self, query: LiteralString, *args: Any) -> Any:
        async with await self.connect() as conn:
            return await scalar(conn, query, *args)

    async def prepare(self) -> None:
        await create_database(self.admin_url, self.dbname)

    async def register_topic(self, topic: str, partitions: int) -> None:
        async with PostgresOutboxStorage(self.url, pool_size=1) as storage:
            await storage.register_topics({topic: partitions})

    async def seed(self, rows: int, keys: int, topic: str = DRAIN_TOPIC) -> float:
        if self._seeded >= rows:
            return 0.0
        outbox = PostgresOutbox(source=SOURCE)
        async with await self.connect() as conn:
            await conn.execute("DELETE FROM outboxkit.outbox")
            conns = [await self.connect() for _ in range(SEED_WRITERS)]

            def writer(conn: psycopg.AsyncConnection[Any]) -> WriteMany:
                async def write(events: list[Event]) -> None:
                    async with conn.transaction():
                        await outbox.add_many(conn, events)

                return write

            try:
                elapsed = await fill(rows, keys, topic, [writer(c) for c in conns])
            finally:
                for c in conns:
                    await c.close()
            await conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
            await conn.execute("DROP TABLE IF EXISTS bench.seed")
            await conn.execute(q(f"CREATE UNLOGGED TABLE bench.seed AS {_SEED_SELECT}"))
            await conn.execute("DELETE FROM outboxkit.outbox")
            distinct = await scalar(conn, "SELECT count(DISTINCT key) FROM bench.seed")
            firsts = await scalar(
                conn,
                "SELECT count(*) FROM bench.seed WHERE value LIKE %s",
                b"%" + SEQ_PLACEHOLDER,
            )
            if firsts != distinct:
                raise RuntimeError(f"seq 0 on {firsts} seeded rows, {distinct} keys: not numbered")
        self._seeded = rows
        return seeded(rows, elapsed, distinct, "rows written by PostgresOutbox.add_many")

    async def load_backlog(self, rows: int, table: str = "outboxkit.outbox") -> float:
        async with await self.connect() as conn:
            async with conn.transaction():
                await load_backlog(conn, table, rows)
            return time.perf_counter()

    async def clear(self) -> None:
        async with await self.connect() as conn:
            await conn.execute("DELETE FROM outboxkit.outbox")
            await conn.execute("DELETE FROM outboxkit.relay_waiting")
            await conn.execute("VACUUM outboxkit.outbox")

    async def pending(self) -> int:
        return int(
            await self.scalar("SELECT count(*) FROM outboxkit.outbox WHERE state = 'pending'")
        )

    async def pending_by_partition(self, topic: str) -> dict[int, int]:
        async with await self.connect() as conn:
            cur = await conn.execute(
                "SELECT partition, count(*) FROM outboxkit.outbox "
                "WHERE state = 'pending' AND topic = %s GROUP BY partition",
                (topic,),
            )
            return {int(p): int(n) for p, n in await cur.fetchall()}

    async def states(self, event_ids: Sequence[str]) -> dict[str, str]:
        async with await self.connect() as conn:
            cur = await conn.execute(
                "SELECT event_id::text, state, partition, attempts FROM outboxkit.outbox "
                "WHERE event_id = ANY(%s::uuid[])",
                (list(event_ids),),
            )
            return {eid: f"{st} p{p} attempts {n}" for eid, st, p, n in await cur.fetchall()}

    async def relays_idle(self, topic: str, partitions: int) -> bool:
        waiting = await self.scalar(
            "SELECT count(*) FROM outboxkit.relay_waiting WHERE topic = %s", topic
        )
        return int(waiting) == partitions

    async def writers(self, count: int) -> list[Writer]:
        return [_PgWriter(await self.connect(autocommit=False)) for _ in range(count)]

    async def diagnostics(self, topic: str) -> str:
        async with await self.connect() as conn:
            return await db_diagnostics(conn, topic)

    async def close(self) -> None:
        """Every connection is opened and closed by the call that uses it."""


async def scalar(conn: psycopg.AsyncConnection[Any], query: LiteralString, *args: Any) -> Any:
    cur = await conn.execute(query, args or None)
    row = await cur.fetchone()
    return None if row is None else row[0]


async def create_database(admin_url: str, name: str) -> None:
    """A fresh, migrated database."""
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(q(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        await conn.execute(q(f"CREATE DATABASE {name}"))
    url = urlsplit(admin_url)._replace(path=f"/{name}").geturl()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)


async def load_backlog(conn: psycopg.AsyncConnection[Any], table: str, rows: int) -> None:
    await conn.execute(
        q(
            f"INSERT INTO {table} ({OUTBOX_COLUMNS}) SELECT {OUTBOX_COLUMNS} "
            f"FROM bench.seed ORDER BY seq LIMIT {int(rows)}"
        )
    )


async def db_diagnostics(conn: psycopg.AsyncConnection[Any], topic: str) -> str:
    """What the database is doing, and the claim query's plan, when a partition stops."""
    lines = []
    cur = await conn.execute(
        "SELECT pid, application_name, state, wait_event_type, wait_event, "
        "now() - query_start, left(query, 60) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'"
    )
    lines += [f"pg backend not idle: {row}" for row in await cur.fetchall()]
    cur = await conn.execute(
        "SELECT c.reltuples, c.relpages, s.n_live_tup, s.n_dead_tup, s.last_autovacuum, "
        "s.last_autoanalyze, s.last_analyze FROM pg_class c JOIN pg_stat_user_tables s "
        "ON s.relid = c.oid WHERE c.oid = 'outboxkit.outbox'::regclass"
    )
    lines.append(
        f"outbox stats (reltuples, relpages, live, dead, autovacuum, autoanalyze, "
        f"analyze): {await cur.fetchone()}"
    )
    cur = await conn.execute(
        "SELECT DISTINCT partition FROM outboxkit.outbox WHERE topic = %s AND state = 'pending' "
        "ORDER BY partition",
        (topic,),
    )
    stuck = [int(p) for (p,) in await cur.fetchall()]
    if stuck:
        # The relay's claim starts from each partition's head of pending records: does that
        # read still use the outbox's index?
        cur = await conn.execute(
            "EXPLAIN SELECT id FROM outboxkit.outbox WHERE topic = %s AND partition = %s "
            "AND state = 'pending' ORDER BY topic, partition, id LIMIT 500",
            (topic, stuck[0]),
        )
        lines += [f"head plan (p{stuck[0]} of {stuck}): {row[0]}" for row in await cur.fetchall()]
    return "\n".join(lines)
