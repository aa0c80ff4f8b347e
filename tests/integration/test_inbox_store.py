"""The PostgreSQL inbox store's batch contract (inbox/store.py), which the worker relies on:
one transaction, duplicates absorbed (also inside one batch), and a raising handler — a Python
exception or an SQL error in the pipelined fast path — leaves exactly the prefix before it
committed and reports itself."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outboxkit.inbox import PostgresInboxStore
from outboxkit.inbox.store import Delivery
from outboxkit.schemas import Event


class Paid(Event, type="test.store_paid", topic="t", key_field="account"):
    account: str
    amount: int


async def effect(event: Paid, tx: psycopg.AsyncConnection[Any]) -> None:
    if event.account == "raises":
        raise ValueError("no")
    table = "missing_table" if event.account == "sql-error" else "effects"
    await tx.execute(f"INSERT INTO {table} VALUES (%s)", (event.id,))  # type: ignore[arg-type]


def deliveries(*events: Paid) -> list[Delivery]:
    return [Delivery(e, effect, "t", 0, i) for i, e in enumerate(events)]


async def effects(url: str) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        return [r[0] for r in await (await conn.execute("SELECT id FROM effects")).fetchall()]


@pytest.fixture
async def store(pg_url: str) -> Any:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE effects (id uuid)")
    async with PostgresInboxStore(pg_url, pool_size=1) as s:
        yield s


async def test_duplicates_take_effect_once_also_within_a_batch(
    store: PostgresInboxStore, pg_url: str
) -> None:
    a, b = Paid(account="a", amount=1), Paid(account="b", amount=2)
    outcome = await store.process_batch("c", deliveries(a, b, a))
    assert (outcome.ran, outcome.failed) == ([True, True, False], None)
    outcome = await store.process_batch("c", deliveries(b, a))
    assert outcome.ran == [False, False]
    assert sorted(map(str, await effects(pg_url))) == sorted([str(a.id), str(b.id)])
    other = await store.process_batch("another-consumer", deliveries(a))
    assert other.ran == [True], "dedupe is per consumer"


async def test_a_batch_may_span_partitions(store: PostgresInboxStore, pg_url: str) -> None:
    """The worker sends one partition's records per batch (the claim takes the topic and the
    partition once); any mix is claimed all the same, each row with its own position."""
    a, b, c = (Paid(account=x, amount=1) for x in "abc")
    mixed = [
        Delivery(a, effect, "t", 0, 5),
        Delivery(b, effect, "u", 2, 7),
        Delivery(c, effect, "t", 1, 9),
    ]
    assert (await store.process_batch("c", mixed)).ran == [True, True, True]
    assert (await store.process_batch("c", mixed)).ran == [False, False, False]
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            'SELECT event_id, topic, partition, "offset" FROM outboxkit.inbox WHERE consumer = %s',
            ("c",),
        )
        rows = {row[0]: row[1:] for row in await cur.fetchall()}
    assert rows == {a.id: ("t", 0, 5), b.id: ("u", 2, 7), c.id: ("t", 1, 9)}


class Odd(Event, type='test.odd "type", with {braces} \\ and NULL', topic="t", key_field="k"):
    k: str


async def test_event_types_with_quotes_commas_and_braces_are_recorded_as_they_are(
    store: PostgresInboxStore, pg_url: str
) -> None:
    async def no_effect(event: Odd, tx: psycopg.AsyncConnection[Any]) -> None:
        pass

    odd = Odd(k="x")
    batch = [Delivery(odd, no_effect, "t", 0, 1), *deliveries(Paid(account="a", amount=1))]
    assert (await store.process_batch("c", batch)).ran == [True, True]
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT event_type FROM outboxkit.inbox WHERE event_id = %s", (odd.id,)
        )
        assert await cur.fetchone() == (Odd.event_type,)


@pytest.mark.parametrize("failure", ["raises", "sql-error"])
async def test_a_failing_handler_commits_the_prefix_and_reports_itself(
    store: PostgresInboxStore, pg_url: str, failure: str
) -> None:
    before = [Paid(account=f"ok{i}", amount=i) for i in range(3)]
    bad, after = Paid(account=failure, amount=9), Paid(account="later", amount=10)
    outcome = await store.process_batch("c", deliveries(*before, bad, after))
    assert outcome.ran == [True, True, True]
    assert outcome.failed is not None
    assert outcome.failed[0] == 3
    assert sorted(map(str, await effects(pg_url))) == sorted(str(e.id) for e in before)
    # The failed and the unattempted deliveries were not claimed: they can still take effect.
    retry = await store.process_batch("c", deliveries(after))
    assert retry.ran == [True]
