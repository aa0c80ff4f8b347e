"""The relay's claim statement stays cheap whatever the table's statistics and plan cache say.

The drain benchmark saw a partition stop for ~50 s inside the claim, intermittently (issue #17).
Reproduced by looping the drain (3 stalls in 60 drains) and a gdb backtrace and perf profile of
the stuck backend: a nested-loop anti-join running a sequential scan of the whole outbox for
every pending row of the partition (16,000 x 100,000 tuples, on CPU). Its plan was a generic plan
that psycopg's prepared statement had cached while idle relays polled an *empty* outbox; the
backlog then arrived in one commit, no ANALYZE had run yet to invalidate the plan, and the first
read after it ran that plan. The tests below build exactly that situation, and the one where
ANALYZE sees one partition hold most of the rows (the primary key's order then satisfied the
claim's ORDER BY and the planner scanned ``outbox_pkey`` from the lowest id). The claim before
these tests existed fails both: minutes in the first, ``outbox_pkey`` in the second.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from typing import Any, LiteralString

import psycopg
import pytest

from outboxkit.core.sql import load_queries
from outboxkit.relay import PostgresOutbox, PostgresOutboxStorage, TopicPartition
from tests.integration.relay_harness import Step, register_topic

QUERIES = load_queries("outboxkit.relay.postgres", "queries.sql")
PARTITIONS = 6


def _sql(text: str) -> LiteralString:
    """Statements built here from the package's own queries and constants."""
    return text


def _prepared_claim() -> LiteralString:
    """The claim with positional parameters, for PREPARE."""
    return (
        QUERIES["settle_and_claim"]
        .replace("%(published)s", "$1")
        .replace("%(topics)s", "$2")
        .replace("%(partitions)s", "$3")
        .replace("%(limit)s", "$4")
        .replace("%(scan)s", "$5")
        .replace("%(keep)s", "$6")
        .replace("%(depth)s", "$7")
        .replace("%(max_bytes)s", "$8")
    )


CLAIM_TYPES = "bigint[], text[], integer[], integer, integer, boolean, integer, bigint"


async def _plans(conn: psycopg.AsyncConnection[Any], keep: bool) -> dict[str, str]:
    await conn.execute(_sql(f"PREPARE claim({CLAIM_TYPES}) AS {_prepared_claim()}"))
    plans = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(_sql(f"SET plan_cache_mode = {mode}"))
        cur = psycopg.AsyncClientCursor(conn)
        await cur.execute(
            _sql(
                "EXPLAIN EXECUTE claim(%s::bigint[], %s::text[], %s::integer[], %s, %s, %s, %s, %s)"
            ),
            ([], ["orders"] * PARTITIONS, list(range(PARTITIONS)), 500, 2000, keep, 4, 2**26),
        )
        plans[mode] = "\n".join(str(row[0]) for row in await cur.fetchall())
    return plans


@pytest.mark.parametrize("keep", [False, True], ids=["delete", "keep"])
async def test_the_claim_reads_partitions_through_the_pending_index_whatever_the_statistics(
    pg_url: str, keep: bool
) -> None:
    await register_topic(pg_url, "orders", PARTITIONS)
    outbox = PostgresOutbox(source="urn:test")
    rng = random.Random(1)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        for _ in range(6):
            async with conn.transaction():
                await outbox.add_many(
                    conn,
                    [
                        Step(topic="orders", entity=f"e{rng.randrange(300)}", seq=i)
                        for i in range(2000)
                    ],
                )
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        # The drain's state: every other partition published, partition 0 a tenth done.
        await conn.execute("DELETE FROM outboxkit.outbox WHERE partition <> 0")
        await conn.execute(
            "DELETE FROM outboxkit.outbox WHERE id IN (SELECT id FROM outboxkit.outbox "
            "WHERE partition = 0 ORDER BY id LIMIT 200)"
        )
        await conn.execute("ANALYZE outboxkit.outbox")
        plans = await _plans(conn, keep)
    for mode, plan in plans.items():
        # The read's alias is `o` (the settling CTEs may use the primary key: by id).
        assert re.search(r"Scan using outbox_pending_idx on outbox o\b", plan), f"{mode}:\n{plan}"
        assert not re.search(r"outbox_pkey on outbox o\b", plan), f"{mode}:\n{plan}"

    # And it still reads what it should: the head of each partition, one record per key.
    async with PostgresOutboxStorage(pg_url) as storage:
        heads = await storage.settle_and_claim([TopicPartition("orders", p) for p in range(6)], 50)
    assert {r.partition for r in heads} == {0}
    assert len({r.key for r in heads}) == len(heads) == 50


async def _load_backlog(url: str, rows: int = 30_000) -> None:
    """A backlog in one commit, as the benchmark loads it; no ANALYZE after."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO outboxkit.outbox (topic, partition, key, value, event_id, event_type) "
            "SELECT 'orders', i %% 6, ('k' || (i %% 1000))::bytea, '{}', gen_random_uuid(), 't' "
            "FROM generate_series(1, %s) i",
            (rows,),
        )


async def test_the_first_read_after_a_backlog_arrives_is_fast_though_relays_polled_it_empty(
    pg_url: str,
) -> None:
    """The relay's sessions plan every claim for the table as it is now."""
    await register_topic(pg_url, "orders", PARTITIONS)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        # PostgreSQL's choice once a statement is prepared and ran 5 times, made certain here.
        dbname = conn.info.dbname
        await conn.execute(
            _sql(f'ALTER DATABASE "{dbname}" SET plan_cache_mode = force_generic_plan')
        )
        # The benchmark empties and vacuums the outbox between runs: statistics say "empty".
        await conn.execute("VACUUM ANALYZE outboxkit.outbox")
    tps = [TopicPartition("orders", p) for p in range(PARTITIONS)]
    async with PostgresOutboxStorage(pg_url, pool_size=1) as storage:
        for _ in range(12):  # idle relays poll an empty outbox (psycopg prepares after 5)
            assert await storage.settle_and_claim(tps, 500) == []
        await _load_backlog(pg_url)
        began = time.monotonic()
        heads = await asyncio.wait_for(storage.settle_and_claim(tps, 500), 25)
        took = time.monotonic() - began
    assert len(heads) == PARTITIONS * 500
    assert took < 3.0, f"the first read after the backlog took {took:.1f} s"


@pytest.mark.parametrize("keep", [False, True], ids=["delete", "keep"])
async def test_even_a_plan_made_for_an_empty_outbox_reads_a_backlog_in_linear_time(
    pg_url: str, keep: bool
) -> None:
    """The statement itself, whatever plan it gets: the held keys are read once per
    partition, never one scan of the outbox per pending row."""
    await register_topic(pg_url, "orders", PARTITIONS)
    partitions = ",".join(str(p) for p in range(PARTITIONS))
    topics = ",".join(["orders"] * PARTITIONS)
    run = _sql(
        f"EXECUTE claim('{{}}', '{{{topics}}}', '{{{partitions}}}', 500, 2000, {keep}, 4, 67108864)"
    )
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE outboxkit.outbox")
        await conn.execute(_sql(f"PREPARE claim({CLAIM_TYPES}) AS {_prepared_claim()}"))
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(run)  # the generic plan, made for an empty table, is now cached
        await _load_backlog(pg_url)
        await conn.execute("SET statement_timeout = '25s'")
        began = time.monotonic()
        await conn.execute(run)
        took = time.monotonic() - began
    assert took < 3.0, f"the stale plan's first read took {took:.1f} s"
