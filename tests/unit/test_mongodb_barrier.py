"""The MongoDB relay's order barrier (relay/mongodb/barrier.py), without a server: which records
of a head read it lets through, and when it asks the database."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from outboxkit.relay.mongodb.barrier import UNLINKED, ChainKey, Link, OrderBarrier
from outboxkit.relay.records import OutboxRecord, TopicPartition

TOPIC = "t"
TP = TopicPartition(TOPIC, 0)


def rec(key: str, position: int, previous: int | None) -> tuple[OutboxRecord, Link]:
    record = OutboxRecord(
        id=f"{key}@{position}",
        topic=TOPIC,
        partition=0,
        key=key.encode(),
        value=None,
        headers=(),
        event_id=uuid.uuid4(),
    )
    return record, Link(position, previous)


class Database:
    """What the check read would find: per key, the positions still pending."""

    def __init__(self, pending: Mapping[str, list[int]] | None = None) -> None:
        self.pending = {k.encode(): v for k, v in (pending or {}).items()}
        self.asked: list[dict[TopicPartition, dict[bytes, int]]] = []

    async def older_pending(self, keys: Mapping[TopicPartition, dict[bytes, int]]) -> set[ChainKey]:
        self.asked.append({tp: dict(k) for tp, k in keys.items()})
        return {
            (tp.topic, key)
            for tp, positions in keys.items()
            for key, position in positions.items()
            if any(p < position for p in self.pending.get(key, []))
        }


def ids(records: list[OutboxRecord]) -> list[object]:
    return [r.id for r in records]


async def test_a_keys_first_record_ever_passes_without_a_check() -> None:
    barrier, db = OrderBarrier(), Database()
    read = [rec("a", 10, None), rec("a", 11, 10), rec("b", 5, None)]
    assert ids(await barrier.admit(read, db.older_pending)) == ["a@10", "a@11", "b@5"]
    assert db.asked == []


async def test_a_record_right_after_the_one_settled_passes_without_a_check() -> None:
    barrier, db = OrderBarrier(), Database()
    [first] = await barrier.admit([rec("a", 10, None)], db.older_pending)
    barrier.settle([first])
    assert ids(await barrier.admit([rec("a", 20, 10)], db.older_pending)) == ["a@20"]
    assert db.asked == []


async def test_an_unknown_predecessor_is_checked_and_a_key_seen_in_part_is_held() -> None:
    """The torn read: a key's records from the middle of a transaction, its older ones not yet
    visible to the read but pending by the time the check runs."""
    barrier = OrderBarrier()
    db = Database({"a": [100, 101, 102], "b": []})
    read = [rec("a", 103, 102), rec("a", 104, 103), rec("b", 50, 49)]
    assert ids(await barrier.admit(read, db.older_pending)) == ["b@50"]
    assert db.asked == [{TP: {b"a": 103, b"b": 50}}]


async def test_within_one_read_a_chain_is_cut_at_its_first_missing_link() -> None:
    barrier, db = OrderBarrier(), Database()
    read = [rec("a", 10, None), rec("a", 11, 10), rec("a", 13, 12), rec("a", 14, 13)]
    assert ids(await barrier.admit(read, db.older_pending)) == ["a@10", "a@11"]


async def test_a_document_older_than_the_chain_field_is_always_checked() -> None:
    barrier, db = OrderBarrier(), Database()
    assert ids(await barrier.admit([rec("a", 10, UNLINKED)], db.older_pending)) == ["a@10"]
    assert db.asked == [{TP: {b"a": 10}}]


async def test_after_a_record_settled_elsewhere_the_next_is_checked_then_passes() -> None:
    """Another relay (or an operator's skip) settled a record this one never saw."""
    barrier, db = OrderBarrier(), Database()
    [first] = await barrier.admit([rec("a", 10, None)], db.older_pending)
    barrier.settle([first])
    assert ids(await barrier.admit([rec("a", 30, 20)], db.older_pending)) == ["a@30"]
    assert db.asked == [{TP: {b"a": 30}}]


async def test_read_order_is_kept_across_keys() -> None:
    barrier, db = OrderBarrier(), Database()
    read = [rec("b", 5, None), rec("a", 10, None), rec("b", 6, 5), rec("a", 11, 10)]
    assert ids(await barrier.admit(read, db.older_pending)) == ["b@5", "a@10", "b@6", "a@11"]


async def test_a_record_this_relay_settled_is_held_when_a_stale_read_returns_it() -> None:
    """Seen in test_failover_mongodb.py (G2: seq 81 published again after 82): right after an
    election, the new primary's majority snapshot can be older than a delete acknowledged before
    it. A record the relay settled then reads as pending again, with the key's later records;
    it passes the older-pending check (nothing older is pending) unless the barrier knows it
    was settled."""
    barrier, db = OrderBarrier(), Database()
    first, second = await barrier.admit([rec("a", 81, 80), rec("a", 82, 81)], db.older_pending)
    barrier.settle([first])
    barrier.settle([second])
    stale = [rec("a", 81, 80), rec("a", 82, 81), rec("b", 5, None)]
    assert ids(await barrier.admit(stale, db.older_pending)) == ["b@5"]
    assert ids(await barrier.admit([rec("a", 83, 82)], db.older_pending)) == ["a@83"]


async def test_past_the_window_a_lower_position_is_a_restarted_chain_not_a_stale_read() -> None:
    """A key idle for a week loses its position document and starts again at a lower
    position: once the stale window is over, it is checked as any record is, not held."""
    barrier, db = OrderBarrier(), Database()
    [first] = await barrier.admit([rec("a", 500, 499)], db.older_pending)
    barrier.settle([first])
    barrier.stale_window = 0.0  # a week later
    assert ids(await barrier.admit([rec("a", 2, 1)], db.older_pending)) == ["a@2"]
