"""Phase ``claims``: the database cost per published record of three ways to claim.

A table (autovacuum off) holds the backlog rows and one client drains it in batches with a fake
publish per batch: (i) ours, as the relay does it, through the relay's public storage
(``PostgresOutboxStorage.settle_and_claim`` on ``outboxkit.outbox``: settle the previous batch,
read the heads of every partition, one record per key; one call may read over two concurrent
statements, counted as one); then, each on a scratch copy of ``outboxkit.outbox`` (same
indexes) with the bench's own SQL: (i') the head without the per-key barrier; (ii) goharvest's
mark-purge; (iii) ``FOR UPDATE SKIP LOCKED`` + DELETE in one transaction per batch. WAL bytes,
WAL records and full-page images, dead tuples, size, and the WAL of the VACUUM that cleans up.
PostgreSQL only.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.relay_bench.harness import DRAIN_TOPIC, Ctx, Result, say
from bench.relay_bench.outbox import load_backlog, q, scalar
from bench.relay_bench.phase_writer import postgres
from outboxkit.relay import OutboxRecord, PostgresOutboxStorage, TopicPartition

CLAIM_TABLE = "bench.claim_outbox"
#: Where the relay's storage claims: the product's own table.
OUTBOX_TABLE = "outboxkit.outbox"


@dataclass
class ClaimStats:
    published: int = 0
    fetched: int = 0
    batches: int = 0
    statements: int = 0
    sleeping: float = 0.0


Strategy = Callable[[psycopg.AsyncConnection[Any], int, float, ClaimStats], Awaitable[None]]


async def fake_publish(seconds: float, stats: ClaimStats) -> None:
    if seconds > 0:
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        stats.sleeping += time.perf_counter() - start


def _ours(url: str, parts: int) -> Strategy:
    """As the relay does it, through its storage: one call per cycle settles the last batch and
    reads every partition's head, one record per key."""
    tps = [TopicPartition(DRAIN_TOPIC, p) for p in range(parts)]

    async def run(
        conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
    ) -> None:
        published: list[OutboxRecord] = []
        per_partition = max(1, batch // parts)
        async with PostgresOutboxStorage(url, pool_size=2) as storage:
            while True:
                # depth 1: one record per key, as the strategies compared claim; the relay's
                # default max_claim_bytes
                records = await storage.settle_and_claim(
                    tps, per_partition, published=published, depth=1, max_bytes=64 * 1024 * 1024
                )
                stats.statements += 1
                stats.fetched += len(records)
                if not records:
                    return
                await fake_publish(publish, stats)
                published = records
                stats.batches += 1
                stats.published += len(records)

    return run


def _whole_batch(parts: int) -> Strategy:
    """The head without the per-key barrier: what the barrier costs."""
    head = q(
        f"SELECT id FROM {CLAIM_TABLE} WHERE topic = %(topic)s AND partition = %(partition)s "
        "AND state = 'pending' ORDER BY topic, partition, id LIMIT %(limit)s"
    )
    delete = q(f"DELETE FROM {CLAIM_TABLE} WHERE id = ANY(%(ids)s)")

    async def run(
        conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
    ) -> None:
        empty = 0
        for part in itertools.cycle(range(parts)):
            cur = await conn.execute(
                head, {"topic": DRAIN_TOPIC, "partition": part, "limit": batch}
            )
            rows = await cur.fetchall()
            stats.statements += 1
            stats.fetched += len(rows)
            if not rows:
                empty += 1
                if empty >= parts:
                    return
                continue
            empty = 0
            await fake_publish(publish, stats)
            await conn.execute(delete, {"ids": [r[0] for r in rows]})
            stats.statements += 1
            stats.batches += 1
            stats.published += len(rows)

    return run


async def _mark_purge(
    conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
) -> None:
    """goharvest: mark the earliest records not marked by this leader, publish, purge on ack."""
    me = uuid.uuid4()
    mark = q(
        f"UPDATE {CLAIM_TABLE} SET leader_id = %(me)s WHERE id IN ("
        f"SELECT id FROM {CLAIM_TABLE} WHERE leader_id IS NULL OR leader_id != %(me)s "
        "ORDER BY id LIMIT %(limit)s) "
        "RETURNING id, created_at, topic, key, value, header_names, header_values, leader_id"
    )
    purge = q(f"DELETE FROM {CLAIM_TABLE} WHERE id = ANY(%(ids)s)")
    while True:
        cur = await conn.execute(mark, {"me": me, "limit": batch})
        rows = await cur.fetchall()
        stats.statements += 1
        stats.fetched += len(rows)
        if not rows:
            return
        await fake_publish(publish, stats)
        await conn.execute(purge, {"ids": [r[0] for r in rows]})
        stats.statements += 1
        stats.batches += 1
        stats.published += len(rows)


async def _lock_based(
    conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
) -> None:
    """The claim is the row locks of an open transaction: lock, publish, delete, commit."""
    claim = q(
        f"SELECT id, topic, partition, key, value, header_names, header_values, event_id, "
        f"attempts, created_at FROM {CLAIM_TABLE} WHERE state = 'pending' "
        "ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
    )
    delete = q(f"DELETE FROM {CLAIM_TABLE} WHERE id = ANY(%(ids)s)")
    while True:
        async with conn.transaction():
            cur = await conn.execute(claim, {"limit": batch})
            rows = await cur.fetchall()
            stats.statements += 2  # BEGIN, SELECT … FOR UPDATE
            stats.fetched += len(rows)
            if not rows:
                return
            await fake_publish(publish, stats)
            await conn.execute(delete, {"ids": [r[0] for r in rows]})
            stats.statements += 2  # DELETE, COMMIT
        stats.batches += 1
        stats.published += len(rows)


async def wal_state(conn: psycopg.AsyncConnection[Any]) -> tuple[str, int, int]:
    cur = await conn.execute(
        "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi FROM pg_stat_wal"
    )
    row = await cur.fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), int(row[2])


async def wal_bytes(conn: psycopg.AsyncConnection[Any], lsn0: str) -> int:
    return int(await scalar(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn0))


async def phase_claims(ctx: Ctx) -> None:
    args = ctx.args
    pg = postgres(ctx)
    await pg.register_topic(DRAIN_TOPIC, args.partitions)
    await pg.seed(max(args.rows, args.claim_rows), args.keys, DRAIN_TOPIC)
    rows = args.claim_rows
    publish = args.claim_publish_ms / 1000
    # (label, strategy, its table, whether it needs goharvest's leader column)
    strategies: list[tuple[str, Strategy, str, bool]] = [
        (
            "(i) ours: settle_and_claim (settle + heads, per-key barrier)",
            _ours(pg.url, args.partitions),
            OUTBOX_TABLE,
            False,
        ),
        (
            "(i') head + DELETE, no per-key barrier",
            _whole_batch(args.partitions),
            CLAIM_TABLE,
            False,
        ),
        ("(ii) mark-purge (goharvest)", _mark_purge, CLAIM_TABLE, True),
        ("(iii) FOR UPDATE SKIP LOCKED + DELETE", _lock_based, CLAIM_TABLE, False),
    ]
    order = (
        "fill, VACUUM, CHECKPOINT (WAL includes full-page images)"
        if args.claim_checkpoint
        else "CHECKPOINT, fill, VACUUM (no checkpoint during the run: WAL without full-page images)"
    )
    say(
        f"{rows:,} rows of bench.seed copied into outboxkit.outbox (ours) or a scratch copy of "
        f"it (same indexes), autovacuum off; {order}; then one client drains it in batches of "
        f"{args.claim_batch} with a fake publish of {args.claim_publish_ms} ms"
    )
    async with await pg.connect() as conn:
        for label, strategy, table, leader_column in strategies:
            await _fresh(conn, table)
            if leader_column:
                await conn.execute(q(f"ALTER TABLE {table} ADD COLUMN leader_id uuid"))
            if not args.claim_checkpoint:
                await conn.execute("CHECKPOINT")
            await load_backlog(conn, table, rows)
            await conn.execute(q(f"VACUUM (ANALYZE) {table}"))
            size0 = int(await scalar(conn, "SELECT pg_total_relation_size(%s)", table))
            if args.claim_checkpoint:
                await conn.execute("CHECKPOINT")
            lsn0, records0, fpi0 = await wal_state(conn)
            stats = ClaimStats()
            start = time.perf_counter()
            await strategy(conn, args.claim_batch, publish, stats)
            elapsed = time.perf_counter() - start
            wal = await wal_bytes(conn, lsn0)
            _, records1, fpi1 = await wal_state(conn)
            await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            dead = int(
                await scalar(
                    conn,
                    "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
                    table,
                )
            )
            size1 = int(await scalar(conn, "SELECT pg_total_relation_size(%s)", table))
            lsn_v, _, _ = await wal_state(conn)
            vstart = time.perf_counter()
            await conn.execute(q(f"VACUUM {table}"))
            vacuum_s = time.perf_counter() - vstart
            vacuum_wal = await wal_bytes(conn, lsn_v)
            n = max(stats.published, 1)
            db_time = elapsed - stats.sleeping
            say(
                f"{label}: {stats.published:,} published in {elapsed:.2f} s "
                f"({stats.published / elapsed:,.0f} rows/s; DB {db_time * 1e6 / n:.0f} µs/record), "
                f"{stats.batches} batches, {stats.statements} statements, "
                f"{stats.fetched / n:.2f} rows read per published; "
                f"WAL {wal / n:.0f} B/record ({(records1 - records0) / n:.2f} WAL records, "
                f"{(fpi1 - fpi0) * 1000 / n:.1f} full-page images per 1000); dead tuples "
                f"{dead:,} ({dead / n:.2f}/record); size {size0 / 2**20:.1f} → "
                f"{size1 / 2**20:.1f} MiB; then VACUUM {vacuum_s:.2f} s, "
                f"{vacuum_wal / n:.0f} B WAL/record"
            )
            ctx.add(
                Result(
                    "claims",
                    label,
                    f"{wal / n:.0f} B WAL/rec",
                    f"{stats.published / elapsed:,.0f} rows/s",
                    f"DB {db_time * 1e6 / n:.0f} µs/rec; {(records1 - records0) / n:.1f} WAL "
                    f"rec/rec; {dead / n:.2f} dead tup/rec; {stats.fetched / n:.2f} rows "
                    f"read/rec; VACUUM after {vacuum_wal / n:.0f} B/rec",
                )
            )
        await conn.execute(q(f"DROP TABLE IF EXISTS {CLAIM_TABLE}"))
        await conn.execute(q(f"TRUNCATE {OUTBOX_TABLE}"))
        await conn.execute(q(f"ALTER TABLE {OUTBOX_TABLE} RESET (autovacuum_enabled)"))


async def _fresh(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """``table`` empty and new-sized, autovacuum off: the product's outbox, or a scratch copy."""
    if table == OUTBOX_TABLE:
        await conn.execute(q(f"TRUNCATE {OUTBOX_TABLE}"))
        await conn.execute(q(f"ALTER TABLE {OUTBOX_TABLE} SET (autovacuum_enabled = false)"))
        return
    await conn.execute(q(f"DROP TABLE IF EXISTS {table}"))
    await conn.execute(
        q(
            f"CREATE TABLE {table} (LIKE {OUTBOX_TABLE} INCLUDING ALL) "
            "WITH (autovacuum_enabled = false)"
        )
    )


# -- main --------------------------------------------------------------------------------------
