"""The relay's claim statement reads every partition through outbox_pending_idx, whatever the
table's statistics say.

The drain benchmark once saw a partition stop for ~50 s inside the claim (issue #17). One cause
the plans show: with ``partition = …`` the planner treats the partition as a constant, so the
primary key's id order also satisfies the claim's ORDER BY; once ANALYZE sees one partition hold
most of the remaining rows, it scans ``outbox_pkey`` from the lowest id, filtering every other
partition's rows and every deleted row not yet vacuumed out — a cost that grows with the table's
history instead of the batch. The claim before this test existed chose that plan here (custom and
generic alike).
"""

from __future__ import annotations

import random
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


async def _plans(conn: psycopg.AsyncConnection[Any], name: str) -> dict[str, str]:
    generic = (
        QUERIES[name]
        .replace("%(published)s", "$1")
        .replace("%(topics)s", "$2")
        .replace("%(partitions)s", "$3")
        .replace("%(limit)s", "$4")
        .replace("%(scan)s", "$5")
    )
    types = "bigint[], text[], integer[], integer, integer"
    await conn.execute(_sql(f"PREPARE claim_{name}({types}) AS {generic}"))
    plans = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(_sql(f"SET plan_cache_mode = {mode}"))
        cur = psycopg.AsyncClientCursor(conn)
        await cur.execute(
            _sql(f"EXPLAIN EXECUTE claim_{name}(%s::bigint[], %s::text[], %s::integer[], %s, %s)"),
            ([], ["orders"] * PARTITIONS, list(range(PARTITIONS)), 500, 2000),
        )
        plans[mode] = "\n".join(str(row[0]) for row in await cur.fetchall())
    return plans


@pytest.mark.parametrize("name", ["next_batch_delete", "next_batch_keep"])
async def test_the_claim_reads_partitions_through_the_pending_index_whatever_the_statistics(
    pg_url: str, name: str
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
        plans = await _plans(conn, name)
    for mode, plan in plans.items():
        assert "Scan using outbox_pending_idx on outbox o" in plan, f"{mode}:\n{plan}"
        assert "outbox_pkey on outbox o" not in plan, f"{mode}:\n{plan}"

    # And it still reads what it should: the head of each partition, one record per key.
    async with PostgresOutboxStorage(pg_url) as storage:
        heads = await storage.next_batch([TopicPartition("orders", p) for p in range(6)], 50)
    assert {r.partition for r in heads} == {0}
    assert len({r.key for r in heads}) == len(heads) == 50
