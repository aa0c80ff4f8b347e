"""The relay's storage contract (relay/storage.py), the same tests for every backend: in memory,
PostgreSQL and MongoDB. Records are written through each backend's own writer, in its own
transactions, exactly as a service writes them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from outboxkit.backends import Transactions
from outboxkit.relay import (
    NotInTransactionError,
    OutboxRecord,
    OutboxStorage,
    RelaySettings,
    TopicPartition,
    UnknownTopicError,
    WakeupSource,
)
from outboxkit.relay.engine import first_per_key
from outboxkit.schemas import Event, partition_for_key
from tests.helpers import wait_for
from tests.integration.backends import BackendCase

TOPIC = "contract"
PARTITIONS = 2
TP0 = TopicPartition(TOPIC, 0)


class Step(Event, type="contract.step", topic=TOPIC, key_field="entity"):
    entity: str
    seq: int


def keys_on(partition: int, count: int) -> list[str]:
    """``count`` entity names whose key lands on ``partition``."""
    found, i = [], 0
    while len(found) < count:
        name = f"e{i}"
        if partition_for_key(name, PARTITIONS) == partition:
            found.append(name)
        i += 1
    return found


A, B, C = keys_on(0, 3)


@pytest.fixture
async def relay(
    backend_case: BackendCase,
) -> AsyncIterator[tuple[OutboxStorage, WakeupSource, Transactions]]:
    settings = RelaySettings(
        database_url=backend_case.url, topics=[TOPIC], retention=timedelta(seconds=0)
    )
    backend = backend_case.backend
    async with (
        backend.relay(settings) as (storage, wakeups),
        backend.transactions(source="urn:test", pool_size=2, connect_timeout=5) as tx,
    ):
        await storage.register_topics({TOPIC: PARTITIONS})
        yield storage, wakeups, tx


async def write(tx: Transactions, *events: Event) -> None:
    async with tx.transaction() as t:
        await tx.outbox.add_many(t, events)


def seqs(records: list[OutboxRecord]) -> list[tuple[str, int]]:
    return [(_entity(r), _seq(r)) for r in records]


def _entity(record: OutboxRecord) -> str:
    return Step.model_validate_json(record.value or b"{}").entity


def _seq(record: OutboxRecord) -> int:
    return Step.model_validate_json(record.value or b"{}").seq


Relay = tuple[OutboxStorage, WakeupSource, Transactions]


async def test_the_head_is_oldest_first_with_each_keys_oldest_record(relay: Relay) -> None:
    storage, _, tx = relay
    await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=A, seq=1))
    await write(tx, Step(entity=C, seq=0), Step(entity=B, seq=1))
    head = first_per_key(await storage.next_batch([TP0], 10))
    assert seqs(head) == [(A, 0), (B, 0), (C, 0)]
    assert seqs(first_per_key(await storage.next_batch([TP0], 2))) == [(A, 0), (B, 0)]
    assert await storage.next_batch([TopicPartition(TOPIC, 1)], 10) == []


async def test_with_depth_each_key_comes_with_its_oldest_records_none_skipped(
    relay: Relay,
) -> None:
    """``depth``: of each of the ``limit`` keys whose oldest record comes first, up to ``depth``
    of its oldest records, in order, none skipped (the engine publishes them one per key per
    transaction). The protocol lets a backend return fewer (one per key is always correct);
    every backend here returns them all."""
    storage, _, tx = relay
    await write(tx, *(Step(entity=A, seq=i) for i in range(5)))
    await write(tx, Step(entity=B, seq=0), Step(entity=C, seq=0), Step(entity=B, seq=1))
    found = await storage.next_batch([TP0], 2, depth=3)
    of_key: dict[str, list[int]] = {}
    for entity, seq in seqs(found):
        of_key.setdefault(entity, []).append(seq)
    assert set(of_key) == {A, B}, "the two keys whose oldest record comes first"
    assert of_key == {A: [0, 1, 2], B: [0, 1]}, "up to depth of each key, oldest first"
    assert first_per_key(found) == [r for r in found if _seq(r) == 0]


async def test_repeated_keys_at_the_head_do_not_starve_other_keys(relay: Relay) -> None:
    storage, _, tx = relay
    await write(tx, *(Step(entity=A, seq=i) for i in range(30)))
    await write(tx, Step(entity=B, seq=0))
    head = first_per_key(await storage.next_batch([TP0], 10))
    assert seqs(head)[0] == (A, 0)
    assert (B, 0) in seqs(head), "a key behind a long run of another must still be read"


async def test_one_call_settles_the_last_batch_and_reads_its_keys_next_records(
    relay: Relay,
) -> None:
    """next_batch: what Kafka accepted is settled (durably) before the heads are read, so the
    same call returns each settled key's next record and never a settled one."""
    storage, _, tx = relay
    await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=A, seq=1))
    first = first_per_key(await storage.next_batch([TP0], 10))
    assert seqs(first) == [(A, 0), (B, 0)]
    second = await storage.next_batch([TP0], 10, published=first)
    assert seqs(second) == [(A, 1)]
    assert await storage.next_batch([TP0], 10, published=second) == []
    assert await storage.backlog() == []


async def test_several_partitions_are_read_at_once_limit_per_partition(relay: Relay) -> None:
    storage, _, tx = relay
    [d] = keys_on(1, 1)
    await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=C, seq=0))
    await write(tx, Step(entity=d, seq=0))
    both = [TP0, TopicPartition(TOPIC, 1)]
    heads = first_per_key(await storage.next_batch(both, 2))
    assert sorted(seqs(heads)) == sorted([(A, 0), (B, 0), (d, 0)])
    assert await storage.next_batch([], 2, published=heads) == []  # settle only
    assert seqs(await storage.next_batch(both, 2)) == [(C, 0)]


async def test_a_rolled_back_transaction_leaves_nothing(relay: Relay) -> None:
    storage, _, tx = relay
    with contextlib.suppress(RuntimeError):
        async with tx.transaction() as t:
            await tx.outbox.add(t, Step(entity=A, seq=0))
            raise RuntimeError("roll back")
    assert await storage.next_batch([TP0], 10) == []


async def test_a_late_commit_is_read_from_the_head_g3(relay: Relay) -> None:
    """G3: a transaction that began first and commits last is still published."""
    storage, _, tx = relay
    async with tx.transaction() as late:
        await tx.outbox.add(late, Step(entity=A, seq=0))
        await write(tx, Step(entity=B, seq=0))
        assert seqs(await storage.next_batch([TP0], 10)) == [(B, 0)]
        [published] = await storage.next_batch([TP0], 10)
        await storage.next_batch([], 1, published=[published], keep=False)
    assert seqs(await storage.next_batch([TP0], 10)) == [(A, 0)]


async def test_a_keys_records_follow_commit_order(relay: Relay) -> None:
    """Two transactions on one key, the second to begin committing first: its event is first."""
    storage, _, tx = relay
    async with tx.transaction() as first_begun:
        await write(tx, Step(entity=A, seq=0))  # begun second, committed first
        await tx.outbox.add(first_begun, Step(entity=A, seq=1))
    records = await storage.next_batch([TP0], 10)
    assert seqs(records[:1]) == [(A, 0)]
    await storage.next_batch([], 1, published=records[:1], keep=False)
    assert seqs(await storage.next_batch([TP0], 10)) == [(A, 1)]


async def test_concurrent_transactions_on_one_key_serialise_in_commit_order(
    relay: Relay, backend_case: BackendCase
) -> None:
    """MongoDB: a key's position is taken inside the writer's transaction, so a second writer
    of the same key cannot commit until the first did, and comes after it (G2)."""
    backend_case.require("same_key_commit_order")
    storage, _, tx = relay
    first_added = asyncio.Event()
    release = asyncio.Event()

    async def first(t: Any) -> None:
        await tx.outbox.add(t, Step(entity=A, seq=0))
        first_added.set()
        await release.wait()

    attempts = 0

    async def second(t: Any) -> None:
        nonlocal attempts
        attempts += 1
        await tx.outbox.add(t, Step(entity=A, seq=1))

    holder = asyncio.create_task(tx.run(first))
    await first_added.wait()
    contender = asyncio.create_task(tx.run(second))
    # The contender conflicts with the open first transaction and tries again.
    await wait_for(lambda: attempts >= 3 or contender.done(), within=10, what="retries")
    assert not contender.done(), "a second writer of the key committed before the first"
    release.set()
    await asyncio.gather(holder, contender)
    records = await storage.next_batch([TP0], 10)
    assert seqs(records[:1]) == [(A, 0)]
    await storage.next_batch([], 1, published=records[:1], keep=False)
    assert seqs(await storage.next_batch([TP0], 10)) == [(A, 1)]


async def test_a_failed_record_blocks_its_key_until_retried_or_skipped(relay: Relay) -> None:
    storage, _, tx = relay
    await write(tx, Step(entity=A, seq=0), Step(entity=A, seq=1), Step(entity=B, seq=0))
    a0, _b0 = await storage.next_batch([TP0], 10)
    await storage.record_failure(a0, "too large", give_up=False)
    [again, _] = await storage.next_batch([TP0], 10)
    assert again.attempts == 1
    assert seqs([again]) == [(A, 0)]
    await storage.record_failure(again, "too large", give_up=True)
    assert seqs(await storage.next_batch([TP0], 10)) == [(B, 0)]
    [failed] = await storage.list_records("failed", 10)
    assert failed.event_id == a0.event_id
    assert failed.last_error == "too large"
    assert failed.attempts == 2
    assert await storage.retry_failed([a0.event_id]) == 1
    assert seqs(first_per_key(await storage.next_batch([TP0], 10))) == [(A, 0), (B, 0)]
    [retried, _] = await storage.next_batch([TP0], 10)
    await storage.record_failure(retried, "still too large", give_up=True)
    assert await storage.skip_failed([a0.event_id]) == 1
    assert seqs(first_per_key(await storage.next_batch([TP0], 10))) == [(A, 1), (B, 0)]
    assert await storage.list_records("failed", 10) == []


async def test_published_records_are_deleted_or_kept_then_replayed_after_pending(
    relay: Relay,
) -> None:
    storage, _, tx = relay
    await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0))
    a0, b0 = await storage.next_batch([TP0], 10)
    await storage.next_batch([], 1, published=[a0], keep=True)
    await storage.next_batch([], 1, published=[b0], keep=False)
    assert await storage.next_batch([TP0], 10) == []
    [kept] = await storage.list_records("published", 10)
    assert kept.event_id == a0.event_id
    assert kept.published_at is not None
    await write(tx, Step(entity=A, seq=1))
    assert await storage.replay([a0.event_id, b0.event_id]) == 1
    pending = await storage.next_batch([TP0], 10)
    assert seqs(pending[:1]) == [(A, 1)], "a replay never overtakes a newer pending event"
    await storage.next_batch([], 1, published=pending[:1], keep=False)
    [replayed] = await storage.next_batch([TP0], 10)
    assert replayed.event_id == a0.event_id
    assert seqs([replayed]) == [(A, 0)]


async def test_retention_cleanup_deletes_kept_records_in_batches(relay: Relay) -> None:
    storage, _, tx = relay
    await write(tx, *(Step(entity=k, seq=0) for k in keys_on(0, 5)))
    await storage.next_batch([], 1, published=await storage.next_batch([TP0], 10), keep=True)
    assert await storage.purge_published(timedelta(seconds=0), 3) == 3
    assert await storage.purge_published(timedelta(seconds=0), 3) == 2
    assert await storage.list_records("published", 10) == []


async def test_backlog_counts_pending_and_failed_per_partition(relay: Relay) -> None:
    storage, _, tx = relay
    await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=B, seq=1))
    [first, _] = await storage.next_batch([TP0], 10)
    await storage.record_failure(first, "refused", give_up=True)
    [backlog] = await storage.backlog()
    assert (backlog.topic, backlog.partition) == (TOPIC, 0)
    assert (backlog.pending, backlog.failed) == (2, 1)
    assert backlog.oldest_created_at is not None


async def test_an_unknown_topic_is_refused_in_the_transaction(relay: Relay) -> None:
    _, _, tx = relay

    class Elsewhere(Event, type="contract.elsewhere", topic="not-registered", key_field="k"):
        k: str

    with pytest.raises(UnknownTopicError, match="not-registered"):
        await write(tx, Elsewhere(k="x"))


async def test_a_writer_outside_a_transaction_is_refused(
    relay: Relay, backend_case: BackendCase
) -> None:
    backend_case.require("outside_transaction")
    _, _, tx = relay
    if backend_case.name == "postgresql":
        pool = tx.pool  # type: ignore[attr-defined]
        async with pool.connection() as conn:
            with pytest.raises(NotInTransactionError):
                await tx.outbox.add(conn, Step(entity=A, seq=0))
    else:
        async with tx.client.start_session() as session:  # type: ignore[attr-defined]
            with pytest.raises(NotInTransactionError, match="transaction"):
                await tx.outbox.add(session, Step(entity=A, seq=0))


async def test_a_commit_wakes_a_waiting_partition_g5(relay: Relay) -> None:
    _storage, wakeups, tx = relay
    stream = wakeups.wakeups()
    woken: asyncio.Queue[TopicPartition | None] = asyncio.Queue()

    async def listen() -> None:
        async for tp in stream:
            woken.put_nowait(tp)

    listener = asyncio.create_task(listen())
    try:
        await wakeups.set_waiting([TP0], True)
        assert await wakeups.writers_settled([TP0])
        # A backend with a connection says "look everywhere" first, once connected.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1):
                while (await woken.get()) is not None:
                    pass
        await write(tx, Step(entity=A, seq=0))
        async with asyncio.timeout(10):
            while (tp := await woken.get()) != TP0:
                assert tp is None, f"woke {tp}, not {TP0}"
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await wakeups.set_waiting([TP0], False)
