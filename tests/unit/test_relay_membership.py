"""A relay's membership lapses when the group coordinator stops answering it (a relay behind a
half-open Kafka link kept /healthz 200 listing partitions the group had moved):
:meth:`KafkaOwnership.lapsed`, on a clock of the test's and a stand-in for what aiokafka's
consumer knows of its membership (:class:`outboxkit.core.kafka_internals.GroupMembership`, whose
canary is tests/integration/test_kafka_internals.py), whose heartbeats the relay notes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTP

from outboxkit.relay import ownership
from outboxkit.relay.ownership import KafkaOwnership
from outboxkit.relay.records import TopicPartition
from tests.unit.relay_parts import settings

OWNED = frozenset({TopicPartition("t", 0), TopicPartition("t", 1)})


class Group:
    """What the relay reads of its consumer's membership: its member, whether it rejoins or
    looks for its coordinator, and heartbeats that the coordinator answers (``answers``) or
    not."""

    def __init__(self) -> None:
        self.member_id: str | None = "member-1"
        self.rejoining = False
        self.coordinator_known = True
        self.answers = True
        self._heard: Callable[[], None] | None = None

    def on_heartbeat_answered(self, heard: Callable[[], None]) -> bool:
        self._heard = heard
        return True

    async def heartbeat(self) -> bool:
        """One heartbeat, as aiokafka's coordinator sends it."""
        if self.answers and self._heard is not None:
            self._heard()
        return self.answers


@pytest.fixture
async def members() -> AsyncIterator[list[KafkaOwnership]]:
    """The members a test makes, their (never started) consumers closed afterwards."""
    made: list[KafkaOwnership] = []
    yield made
    for member in made:
        await member._consumer.stop()


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The relay's monotonic clock, for the test to move."""
    clock = [1000.0]
    monkeypatch.setattr(ownership, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return clock


def member_of(
    members: list[KafkaOwnership], **values: Any
) -> tuple[KafkaOwnership, Group, list[Any]]:
    """A member on the stand-in coordinator, owning :data:`OWNED`, and the list it calls back
    into, in order: ``("assigned" | "revoked", partitions)`` (a test adds its own entries)."""
    calls: list[Any] = []

    async def on_assigned(partitions: frozenset[TopicPartition]) -> None:
        calls.append(("assigned", partitions))

    async def on_revoked(partitions: frozenset[TopicPartition]) -> None:
        calls.append(("revoked", partitions))

    member = KafkaOwnership(
        settings(session_timeout=10, heartbeat_interval=1, **values),
        on_assigned=on_assigned,
        on_revoked=on_revoked,
    )
    members.append(member)
    coordinator = Group()
    member._membership = coordinator  # type: ignore[assignment]
    member._hear_heartbeats()
    member.owned = OWNED
    return member, coordinator, calls


def called(calls: list[Any], kind: str) -> list[frozenset[TopicPartition]]:
    """The partitions of each ``kind`` ("assigned", "revoked") callback, in order."""
    return [c[1] for c in calls if isinstance(c, tuple) and c[0] == kind]


async def test_a_member_the_coordinator_stops_answering_lapses_after_two_session_timeouts(
    monkeypatch: pytest.MonkeyPatch, members: list[KafkaOwnership], now: list[float]
) -> None:
    """Would catch a relay that keeps publishing (and reporting healthy) partitions the group
    has surely given away (no answer for two session timeouts), one that gives them up while
    heartbeats are answered, during a coordinator's failover or while its join may still be held
    by the coordinator, or one that stays lapsed after rejoining."""
    member, coordinator, calls = member_of(members, revoke_timeout=20)
    monkeypatch.setattr(member._consumer, "pause", lambda *tps: None)

    now[0] += 9.0
    assert await coordinator.heartbeat()  # answered: heard now
    coordinator.answers = False
    now[0] += 19.9  # a coordinator failover may take a session timeout and more
    assert not await coordinator.heartbeat()
    await member._check_membership()
    assert (member.lapsed(), called(calls, "revoked"), member.owned) == (None, [], OWNED)

    # While a join is pending the coordinator may hold it until every member joined; while
    # the coordinator is looked for, it may be moving to another broker, keeping the group.
    now[0] += 0.6  # 20.5 s without an answer
    coordinator.rejoining = True
    assert member.lapsed() is None
    coordinator.rejoining = False
    coordinator.coordinator_known = False
    assert member.lapsed() is None
    coordinator.coordinator_known = True

    assert member.lapsed() == pytest.approx(20.5)
    await member._check_membership()
    assert (called(calls, "revoked"), member.owned) == ([OWNED], frozenset())
    await member._check_membership()  # nothing more to give up
    assert called(calls, "revoked") == [OWNED]

    # The link heals: the group assigns partitions again (the join was answered).
    await member._assigned({KafkaTP("t", 1)})
    assert member.lapsed() is None
    assert member.owned == {TopicPartition("t", 1)}
    assert called(calls, "assigned") == [{TopicPartition("t", 1)}]


async def test_a_lapsed_member_answered_again_without_a_rebalance_takes_back_its_partitions(
    monkeypatch: pytest.MonkeyPatch, members: list[KafkaOwnership], now: list[float]
) -> None:
    """A coordinator that moved to another broker keeps the group as it was: no rebalance
    comes, and a relay whose membership lapsed meanwhile must take back the partitions it
    still owns, or they would wait for good."""
    member, coordinator, calls = member_of(members)
    monkeypatch.setattr(member._consumer, "assignment", lambda: {KafkaTP("t", 0), KafkaTP("t", 1)})
    now[0] += 21.0
    await member._check_membership()
    assert member.owned == frozenset()
    assert await coordinator.heartbeat()  # the coordinator answers: same generation
    await member._check_membership()
    assert (member.owned, called(calls, "assigned"), member.lapsed()) == (OWNED, [OWNED], None)


async def test_a_member_that_steps_aside_leaves_first_then_gives_up_its_partitions_and_rejoins(
    monkeypatch: pytest.MonkeyPatch, members: list[KafkaOwnership], now: list[float]
) -> None:
    """A relay that cannot read its database steps out of its group (side_tasks.StepAside).
    Would catch one that stops its workers before it leaves (they wait on the database, up to
    revoke_timeout, and the group with them), one that reports its membership lapsed while it
    is out on purpose, or one that does not subscribe again to rejoin."""
    member, _, calls = member_of(members)
    consumer: Any = member._consumer
    monkeypatch.setattr(consumer, "unsubscribe", lambda: calls.append("unsubscribe"))
    monkeypatch.setattr(
        consumer, "subscribe", lambda topics, listener: calls.append(("subscribe", topics))
    )

    await member.step_aside()
    await member.step_aside()  # once out, nothing more to do
    assert calls == ["unsubscribe", ("revoked", OWNED)]
    assert member.owned == frozenset()
    now[0] += 60.0  # no heartbeat is answered while out of the group: that is no lapse
    assert member.lapsed() is None
    await member._check_membership()

    member.step_in()
    member.step_in()
    assert calls[2:] == [("subscribe", ["t"])]
    assert member.lapsed() is None  # its clock starts again with the join
    now[0] += 19.0
    assert member.lapsed() is None


async def test_a_commit_given_up_by_its_timeout_is_marked_read_and_not_confirmed(
    monkeypatch: pytest.MonkeyPatch, members: list[KafkaOwnership]
) -> None:
    """Would catch the traceback a relay behind a half-open Kafka link logged ("Task exception
    was never retrieved", health failing): confirming its membership, it gave up an offset
    commit after its session timeout, and the commit aiokafka still sent failed when the link
    closed. The relay must not be confirmed, and must mark the abandoned commit's outcome read
    (what that does to aiokafka's commit task: tests/unit/test_kafka_internals.py)."""
    member, _, _ = member_of(members)
    monkeypatch.setattr(
        member, "_settings", member._settings.model_copy(update={"session_timeout": 0.05})
    )
    marked: list[bool] = []
    monkeypatch.setattr(
        ownership.kafka_internals, "abandoned_commits_read", lambda: marked.append(True)
    )

    async def commit(offsets: dict[KafkaTP, int]) -> None:
        await asyncio.Event().wait()  # the link is half-open: no answer

    async def position(tp: KafkaTP) -> int:
        return 7

    consumer: Any = member._consumer
    monkeypatch.setattr(consumer, "assignment", lambda: {KafkaTP("t", 0), KafkaTP("t", 1)})
    monkeypatch.setattr(consumer, "position", position)
    monkeypatch.setattr(consumer, "commit", commit)

    assert not await member.confirm(OWNED)
    assert marked == [True]
