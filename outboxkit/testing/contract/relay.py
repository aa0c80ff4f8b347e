"""The relay's storage contract (:class:`~outboxkit.relay.OutboxStorage`,
:class:`~outboxkit.relay.WakeupSource`, and the operator's
:class:`~outboxkit.relay.OutboxOperations`): what every backend must do, proven on a real
database.

Records are written through the backend's own writer, in its own transactions, exactly as a
service writes them; the tests then call the storage as the relay does. Subclass
:class:`RelayStorageContract` in a test module and give it a ``relay_backend`` fixture
(:class:`~outboxkit.testing.contract.RelayBackend`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio

from outboxkit.backends import Transactions
from outboxkit.relay import (
    NotInTransactionError,
    OutboxOperations,
    OutboxRecord,
    OutboxStorage,
    TopicPartition,
    UnknownTopicError,
    WakeupSource,
    first_per_key,
    presence,
    record_bytes,
)
from outboxkit.schemas import Event, partition_for_key
from outboxkit.testing.contract.backend import RelayBackend, require

TOPIC = "contract"
PARTITIONS = 2
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
#: The value size of the records that the byte bound cuts.
BLOB = 100_000
#: A cancelled wake-up stream ends within this (a relay's stop waits 5 s for its side tasks).
_STREAM_ENDS_WITHIN = 3.0


class Step(Event, type="contract.step", topic=TOPIC, key_field="entity"):
    entity: str
    seq: int
    blob: str = ""


def keys_on(partition: int, count: int) -> list[str]:
    """``count`` entity names whose key lands on ``partition``."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"e{i}"
        if partition_for_key(name, PARTITIONS) == partition:
            found.append(name)
        i += 1
    return found


(A, B, C), (D,) = keys_on(0, 3), keys_on(1, 1)

#: A backend's relay storage, its wake-ups and its writers' transactions, on ``contract``.
Relay = tuple[OutboxStorage, WakeupSource, Transactions]


async def write(tx: Transactions, *events: Event) -> None:
    async with tx.transaction() as t:
        await tx.outbox.add_many(t, events)


def seqs(records: list[OutboxRecord]) -> list[tuple[str, int]]:
    return [(_step(r).entity, _step(r).seq) for r in records]


def _step(record: OutboxRecord) -> Step:
    return Step.model_validate_json(record.value or b"{}")


async def _wait_for(condition: Callable[[], bool], *, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _step_within(seconds: float, what: str) -> AsyncIterator[None]:
    """Fail with ``what`` if the block takes longer than ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise AssertionError(f"{what}: not within {seconds} s") from None


@contextlib.asynccontextmanager
async def announced(backend: RelayBackend, group: str, member: str) -> AsyncIterator[OutboxStorage]:
    """A relay's storage that announced ``member`` of ``group``; its database session ends
    when the block does."""
    async with backend.relay() as (storage, _):
        await storage.announce_member(group, member)
        yield storage


async def departed_soon(
    storage: OutboxStorage, group: str, own: str, expected: list[str], within: float = 10.0
) -> None:
    """Until ``storage.departed_members(group, own)`` answers ``expected``."""
    deadline = time.monotonic() + within
    while (found := await storage.departed_members(group, own)) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"departed members {found}, not {expected} within {within} s")
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
class RelayStorageContract:
    """The relay storage contract. Needs a ``relay_backend`` fixture: one fresh database of the
    backend per test."""

    @pytest_asyncio.fixture
    async def relay(self, relay_backend: RelayBackend) -> AsyncIterator[Relay]:
        async with (
            relay_backend.relay(retention=timedelta(seconds=0)) as (storage, wakeups),
            relay_backend.transactions(pool_size=2) as tx,
        ):
            await storage.register_topics({TOPIC: PARTITIONS})
            yield storage, wakeups, tx

    @pytest_asyncio.fixture
    async def operations(self, relay_backend: RelayBackend) -> AsyncIterator[OutboxOperations]:
        async with relay_backend.operations() as operations:
            yield operations

    async def test_the_head_is_oldest_first_with_each_keys_oldest_record(
        self, relay: Relay
    ) -> None:
        storage, _, tx = relay
        await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=A, seq=1))
        await write(tx, Step(entity=C, seq=0), Step(entity=B, seq=1))
        head = first_per_key(await storage.settle_and_claim([TP0], 10))
        assert seqs(head) == [(A, 0), (B, 0), (C, 0)]
        assert seqs(first_per_key(await storage.settle_and_claim([TP0], 2))) == [(A, 0), (B, 0)]
        assert await storage.settle_and_claim([TP1], 10) == []

    async def test_with_depth_each_key_comes_with_its_oldest_records_none_skipped(
        self, relay: Relay
    ) -> None:
        """``depth``: of each of the ``limit`` keys whose oldest record comes first, up to
        ``depth`` of its oldest records, in order, none skipped (the engine publishes them one
        per key per transaction). The protocol lets a backend return fewer (one per key is
        always correct); every backend of outboxkit returns them all."""
        storage, _, tx = relay
        await write(tx, *(Step(entity=A, seq=i) for i in range(5)))
        await write(tx, Step(entity=B, seq=0), Step(entity=C, seq=0), Step(entity=B, seq=1))
        found = await storage.settle_and_claim([TP0], 2, depth=3)
        of_key: dict[str, list[int]] = {}
        for entity, seq in seqs(found):
            of_key.setdefault(entity, []).append(seq)
        assert set(of_key) == {A, B}, "the two keys whose oldest record comes first"
        assert of_key == {A: [0, 1, 2], B: [0, 1]}, "up to depth of each key, oldest first"
        assert first_per_key(found) == [r for r in found if _step(r).seq == 0]

    async def test_repeated_keys_at_the_head_do_not_starve_other_keys(self, relay: Relay) -> None:
        storage, _, tx = relay
        await write(tx, *(Step(entity=A, seq=i) for i in range(30)))
        await write(tx, Step(entity=B, seq=0))
        head = first_per_key(await storage.settle_and_claim([TP0], 10))
        assert seqs(head)[0] == (A, 0)
        assert (B, 0) in seqs(head), "a key behind a long run of another must still be read"

    async def test_one_call_settles_the_last_batch_and_reads_its_keys_next_records(
        self, relay: Relay
    ) -> None:
        """settle_and_claim: what Kafka accepted is settled (durably) before the heads are read, so
        the same call returns each settled key's next record and never a settled one."""
        storage, _, tx = relay
        await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=A, seq=1))
        first = first_per_key(await storage.settle_and_claim([TP0], 10))
        assert seqs(first) == [(A, 0), (B, 0)]
        second = await storage.settle_and_claim([TP0], 10, published=first)
        assert seqs(second) == [(A, 1)]
        assert await storage.settle_and_claim([TP0], 10, published=second) == []
        assert await storage.backlog() == []

    async def test_several_partitions_are_read_at_once_limit_per_partition(
        self, relay: Relay
    ) -> None:
        storage, _, tx = relay
        await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=C, seq=0))
        await write(tx, Step(entity=D, seq=0))
        both = [TP0, TP1]
        heads = first_per_key(await storage.settle_and_claim(both, 2))
        assert sorted(seqs(heads)) == sorted([(A, 0), (B, 0), (D, 0)])
        assert await storage.settle_and_claim([], 2, published=heads) == []  # settle only
        assert seqs(await storage.settle_and_claim(both, 2)) == [(C, 0)]

    async def test_a_rolled_back_transaction_leaves_nothing(self, relay: Relay) -> None:
        storage, _, tx = relay
        with contextlib.suppress(RuntimeError):
            async with tx.transaction() as t:
                await tx.outbox.add(t, Step(entity=A, seq=0))
                raise RuntimeError("roll back")
        assert await storage.settle_and_claim([TP0], 10) == []

    async def test_a_late_commit_is_read_from_the_head_g3(self, relay: Relay) -> None:
        """G3: a transaction that began first and commits last is still published."""
        storage, _, tx = relay
        async with tx.transaction() as late:
            await tx.outbox.add(late, Step(entity=A, seq=0))
            await write(tx, Step(entity=B, seq=0))
            assert seqs(await storage.settle_and_claim([TP0], 10)) == [(B, 0)]
            [published] = await storage.settle_and_claim([TP0], 10)
            await storage.settle_and_claim([], 1, published=[published], keep=False)
        assert seqs(await storage.settle_and_claim([TP0], 10)) == [(A, 0)]

    async def test_a_keys_records_follow_commit_order(self, relay: Relay) -> None:
        """Two transactions on one key, the second to begin committing first: its event is
        first."""
        storage, _, tx = relay
        async with tx.transaction() as first_begun:
            await write(tx, Step(entity=A, seq=0))  # begun second, committed first
            await tx.outbox.add(first_begun, Step(entity=A, seq=1))
        records = await storage.settle_and_claim([TP0], 10)
        assert seqs(records[:1]) == [(A, 0)]
        await storage.settle_and_claim([], 1, published=records[:1], keep=False)
        assert seqs(await storage.settle_and_claim([TP0], 10)) == [(A, 1)]

    async def test_concurrent_transactions_on_one_key_serialise_in_commit_order(
        self, relay: Relay, relay_backend: RelayBackend
    ) -> None:
        """``same_key_commit_order`` (MongoDB): a key's position is taken inside the writer's
        transaction, so a second writer of the same key cannot commit until the first did, and
        comes after it (G2)."""
        require(relay_backend, "same_key_commit_order")
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
        await _wait_for(lambda: attempts >= 3 or contender.done(), within=10, what="retries")
        assert not contender.done(), "a second writer of the key committed before the first"
        release.set()
        await asyncio.gather(holder, contender)
        records = await storage.settle_and_claim([TP0], 10)
        assert seqs(records[:1]) == [(A, 0)]
        await storage.settle_and_claim([], 1, published=records[:1], keep=False)
        assert seqs(await storage.settle_and_claim([TP0], 10)) == [(A, 1)]

    async def test_a_failed_record_blocks_its_key_until_retried_or_skipped(
        self, relay: Relay, operations: OutboxOperations
    ) -> None:
        storage, _, tx = relay
        await write(tx, Step(entity=A, seq=0), Step(entity=A, seq=1), Step(entity=B, seq=0))
        a0, _b0 = await storage.settle_and_claim([TP0], 10)
        await storage.record_failure(a0, "too large", give_up=False)
        [again, _] = await storage.settle_and_claim([TP0], 10)
        assert again.attempts == 1
        assert seqs([again]) == [(A, 0)]
        await storage.record_failure(again, "too large", give_up=True)
        assert seqs(await storage.settle_and_claim([TP0], 10)) == [(B, 0)]
        [failed] = await operations.list_records("failed", 10)
        assert failed.event_id == a0.event_id
        assert failed.last_error == "too large"
        assert failed.attempts == 2
        assert await operations.retry_failed([a0.event_id]) == 1
        assert seqs(first_per_key(await storage.settle_and_claim([TP0], 10))) == [(A, 0), (B, 0)]
        [retried, _] = await storage.settle_and_claim([TP0], 10)
        await storage.record_failure(retried, "still too large", give_up=True)
        assert await operations.skip_failed([a0.event_id]) == 1
        assert seqs(first_per_key(await storage.settle_and_claim([TP0], 10))) == [(A, 1), (B, 0)]
        assert await operations.list_records("failed", 10) == []

    async def test_published_records_are_deleted_or_kept_then_replayed_after_pending(
        self, relay: Relay, operations: OutboxOperations
    ) -> None:
        storage, _, tx = relay
        await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0))
        a0, b0 = await storage.settle_and_claim([TP0], 10)
        await storage.settle_and_claim([], 1, published=[a0], keep=True)
        await storage.settle_and_claim([], 1, published=[b0], keep=False)
        assert await storage.settle_and_claim([TP0], 10) == []
        [kept] = await operations.list_records("published", 10)
        assert kept.event_id == a0.event_id
        assert kept.published_at is not None
        await write(tx, Step(entity=A, seq=1))
        assert await operations.replay([a0.event_id, b0.event_id]) == 1
        pending = await storage.settle_and_claim([TP0], 10)
        assert seqs(pending[:1]) == [(A, 1)], "a replay never overtakes a newer pending event"
        await storage.settle_and_claim([], 1, published=pending[:1], keep=False)
        [replayed] = await storage.settle_and_claim([TP0], 10)
        assert replayed.event_id == a0.event_id
        assert seqs([replayed]) == [(A, 0)]

    async def test_retention_cleanup_deletes_kept_records_in_batches(
        self, relay: Relay, operations: OutboxOperations
    ) -> None:
        storage, _, tx = relay
        await write(tx, *(Step(entity=k, seq=0) for k in keys_on(0, 5)))
        await storage.settle_and_claim(
            [], 1, published=await storage.settle_and_claim([TP0], 10), keep=True
        )
        assert await storage.purge_published(timedelta(seconds=0), 3) == 3
        assert await storage.purge_published(timedelta(seconds=0), 3) == 2
        assert await operations.list_records("published", 10) == []

    async def test_backlog_counts_pending_and_failed_per_partition(self, relay: Relay) -> None:
        storage, _, tx = relay
        await write(tx, Step(entity=A, seq=0), Step(entity=B, seq=0), Step(entity=B, seq=1))
        [first, _] = await storage.settle_and_claim([TP0], 10)
        await storage.record_failure(first, "refused", give_up=True)
        [backlog] = await storage.backlog()
        assert (backlog.topic, backlog.partition) == (TOPIC, 0)
        assert (backlog.pending, backlog.failed) == (2, 1)
        assert backlog.oldest_created_at is not None
        # A real database measures the age on its own clock (the stall check's).
        assert backlog.oldest_age is None or 0 <= backlog.oldest_age < 60

    async def test_an_unknown_topic_is_refused_in_the_transaction(self, relay: Relay) -> None:
        _, _, tx = relay

        class Elsewhere(Event, type="contract.elsewhere", topic="not-registered", key_field="k"):
            k: str

        with pytest.raises(UnknownTopicError, match="not-registered"):
            await write(tx, Elsewhere(k="x"))

    async def test_a_writer_outside_a_transaction_is_refused(
        self, relay: Relay, relay_backend: RelayBackend
    ) -> None:
        """``outside_transaction``: a writer handed a connection or session with no open
        transaction refuses it (its row would commit alone, without the service's writes)."""
        require(relay_backend, "outside_transaction")
        _, _, tx = relay
        async with relay_backend.outside_transaction(tx) as handle:
            with pytest.raises(NotInTransactionError, match="transaction"):
                await tx.outbox.add(handle, Step(entity=A, seq=0))

    async def test_a_commit_wakes_a_waiting_partition_g5(self, relay: Relay) -> None:
        """Every step is bounded and named: a backend whose stream or commit hangs fails here
        saying which, not at the suite's timeout (on MongoDB, once, a hang took CI's 120 s).
        The stream ends soon after it is cancelled, as a stopping relay cancels it: on Python
        3.11 pymongo lost that cancellation (``asyncio.wait_for``, see core/waiting.py) in 4 of
        5 runs, and the stream read on for good."""
        _storage, wakeups, tx = relay
        stream = wakeups.wakeups()
        woken: asyncio.Queue[TopicPartition | None] = asyncio.Queue()

        async def listen() -> None:
            async for tp in stream:
                woken.put_nowait(tp)

        listener = asyncio.create_task(listen())
        try:
            async with _step_within(10, "declaring partition 0 waiting"):
                await wakeups.set_waiting([TP0], True)
                assert await wakeups.earlier_writers_ended([TP0])
            # A backend with a connection says "look everywhere" first, once connected.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):
                    while (await woken.get()) is not None:
                        pass
            async with _step_within(10, "committing one record"):
                await write(tx, Step(entity=A, seq=0))
            async with _step_within(10, f"a wake-up of {TP0} after the commit"):
                while (tp := await woken.get()) != TP0:
                    assert tp is None, f"woke {tp}, not {TP0}"
        finally:
            listener.cancel()
            # Bounded, as a relay stops (core/supervisor.py, which gives it 5 s): a driver
            # call that ignores its cancellation is left behind, not waited on forever.
            await asyncio.wait([listener], timeout=_STREAM_ENDS_WITHIN)
            if listener.done():
                if not listener.cancelled():
                    listener.result()  # the stream's own error, if it raised one
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()
            async with _step_within(10, "declaring partition 0 no longer waiting"):
                await wakeups.set_waiting([TP0], False)
        assert listener.done(), (
            f"the wake-up stream still ran {_STREAM_ENDS_WITHIN} s after it was cancelled"
        )

    async def test_a_claim_stops_adding_records_once_their_bytes_pass_the_bound(
        self, relay: Relay
    ) -> None:
        """``max_bytes`` (G8; before, a claim was bounded in records only: one
        held 7 records, 37.8 MB, in the relay's memory). Partition 0 gets five 100 KB records
        (commit order A0 B0 A1 C0 B1), partition 1 one. With a bound of 250 KB, partition 0
        returns records while the bytes before them are under it — A0, B0, A1 (300 KB, at least
        the bound: the relay can tell it was cut) — each key a prefix of its records; partition
        1 its own. A bound below one record still returns each partition's first (a big record
        moves). Settling moves on to the rest. Catches a claim bounded in records only, a bound
        that starves a large record, a cut that skips a record of a key."""
        storage, _, tx = relay
        order = [(A, 0), (B, 0), (A, 1), (C, 0), (B, 1)]
        async with tx.transaction() as t:
            for entity, seq in order:
                await tx.outbox.add(t, Step(entity=entity, seq=seq, blob="x" * BLOB))
            await tx.outbox.add(t, Step(entity=D, seq=0))

        everything = await storage.settle_and_claim([TP0, TP1], 10, depth=3)
        assert len(everything) == 6, "no bound: every record"
        assert all(BLOB < record_bytes(r) < BLOB + 1000 for r in everything if r.partition == 0)

        bound = 250_000
        claimed = await storage.settle_and_claim([TP0, TP1], 10, depth=3, max_bytes=bound)
        assert sorted(seqs(claimed)) == sorted([(A, 0), (B, 0), (A, 1), (D, 0)])
        on_p0 = sum(record_bytes(r) for r in claimed if r.partition == 0)
        assert on_p0 >= bound, "a partition cut short returns at least the bound"

        tiny = await storage.settle_and_claim([TP0, TP1], 10, depth=3, max_bytes=1)
        assert sorted(seqs(tiny)) == sorted([(A, 0), (D, 0)]), "always each partition's first"

        rest = await storage.settle_and_claim(
            [TP0], 10, published=claimed, depth=3, max_bytes=bound
        )
        assert sorted(seqs(rest)) == sorted([(C, 0), (B, 1)])

    async def test_a_relay_whose_session_ended_is_departed_until_forgotten(
        self, relay_backend: RelayBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``presence``: a relay learns from the storage that another relay's database session
        ended (it died, or lost the database), sooner than Kafka's session timeout, and every
        relay keeps hearing it until one says Kafka was told (``forget_members``). A member
        that announced itself again is alive, and forgetting it keeps its announcement; another
        group's member is not this group's business. Catches a departure missed, one reported
        once only (lost if Kafka was down then), a live relay reported dead, and a forget that
        drops a live member's announcement (its next death would go unseen)."""
        require(relay_backend, "presence")
        monkeypatch.setattr(presence, "RECONNECT_GRACE", 0.0)  # outboxkit's: no wait at start
        group = "contract.relays"
        async with (
            announced(relay_backend, group, "b") as b,
            announced(relay_backend, group, "c") as c,
        ):
            async with (
                announced(relay_backend, group, "a"),
                announced(relay_backend, "contract.others", "x"),
            ):
                assert not await b.departed_members(group, "b"), "every session is alive"
            await departed_soon(b, group, "b", ["a"])
            assert await c.departed_members(group, "c") == ["a"], "told to every relay"
            assert await b.departed_members(group, "b") == ["a"], "until forgotten"

            async with announced(relay_backend, group, "a"):  # back: it had lost the database
                await departed_soon(b, group, "b", [])
                await c.forget_members(group, ["a"])  # Kafka was told of the old departure
            await departed_soon(c, group, "c", ["a"])  # so its announcement was kept
            await b.forget_members(group, ["a"])
            assert await b.departed_members(group, "b") == []
            assert await c.departed_members(group, "c") == []
