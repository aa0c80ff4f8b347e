"""The writer API against the real PostgreSQL: rows appear only with the caller's commit."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit.relay import (
    NotInTransactionError,
    PostgresOutbox,
    PostgresOutboxStorage,
    TopicPartition,
    UnknownTopicError,
)
from outboxkit.schemas import partition_for_key
from tests.integration.relay_harness import Step, register_topic

outbox = PostgresOutbox(source="urn:test")


async def _rows(url: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT topic, partition, key, event_id, event_type, state FROM outboxkit.outbox "
            "ORDER BY id"
        )
        return await cur.fetchall()


async def test_rows_follow_the_callers_transaction(pg_url: str) -> None:
    await register_topic(pg_url, "orders", 6)
    kept = Step(topic="orders", entity="a", seq=0)
    dropped = Step(topic="orders", entity="b", seq=0)

    async def fail_after_writing(conn: psycopg.AsyncConnection[object]) -> None:
        async with conn.transaction():
            await outbox.add(conn, dropped)
            raise RuntimeError("the service fails after writing")

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        async with conn.transaction():
            await outbox.add(conn, kept)
        with pytest.raises(RuntimeError):
            await fail_after_writing(conn)
    rows = await _rows(pg_url)
    assert rows == [
        ("orders", partition_for_key("a", 6), b"a", kept.id, "test.step", "pending"),
    ]


async def test_add_many_keeps_order_in_one_round_trip(pg_url: str) -> None:
    await register_topic(pg_url, "orders", 3)
    events = [Step(topic="orders", entity="a", seq=i) for i in range(5)]
    async with await psycopg.AsyncConnection.connect(pg_url) as conn, conn.transaction():
        await outbox.add_many(conn, events)
    assert [r[3] for r in await _rows(pg_url)] == [e.id for e in events]


async def test_autocommit_connection_without_transaction_is_refused(pg_url: str) -> None:
    await register_topic(pg_url, "orders", 3)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(NotInTransactionError, match=r"conn\.transaction"):
            await outbox.add(conn, Step(topic="orders", entity="a", seq=0))
    assert await _rows(pg_url) == []


async def test_unknown_topic_says_how_to_fix(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        with pytest.raises(UnknownTopicError, match="OUTBOXKIT_TOPICS"):
            async with conn.transaction():
                await outbox.add(conn, Step(topic="nowhere", entity="a", seq=0))
    assert await _rows(pg_url) == []


async def test_a_writer_open_across_the_idle_declaration_is_waited_for(pg_url: str) -> None:
    """G5's race: a writer's trigger ran before the relay declared itself waiting (so it will
    send no wake-up), and it commits after. The relay's last look must come after that commit:
    earlier_writers_ended stays false until every transaction open at the declaration has ended."""
    await register_topic(pg_url, "orders", 1)
    tp = TopicPartition("orders", 0)
    async with (
        PostgresOutboxStorage(pg_url) as storage,
        await psycopg.AsyncConnection.connect(pg_url) as writer,
    ):
        await writer.execute("SELECT 1")  # opens the writer's transaction
        await PostgresOutbox(source="urn:test").add(writer, Step(topic="orders", entity="a", seq=0))
        await storage.set_waiting([tp], True)  # the writer's transaction is still open
        assert await storage.settle_and_claim([tp], 10) == []
        assert not await storage.earlier_writers_ended([tp])
        await writer.commit()
        assert await storage.earlier_writers_ended([tp])
        assert len(await storage.settle_and_claim([tp], 10)) == 1
