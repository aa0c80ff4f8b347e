"""Partitions a relay holds but cannot publish (relay/stuck.py), and the assignor that keeps them
from it (relay/assignor.py): a block with records pending, no progress and a retried error or a
long stage for ``step_aside_after`` is stuck; the relay says so once, shows it, and rejoins its
group asking not to be given those partitions; the group's assignor honours the request when
another member can take them.

Before, a relay whose heartbeats the group coordinator answered kept such partitions until the
cause went away (a partition leader it could not reach: until the link healed), and nothing
said so until the oldest record passed ``stall_after``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import structlog
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from outboxkit.relay.assignor import BlockAssignor, avoiding, split
from outboxkit.relay.blocks import Block
from outboxkit.relay.records import PartitionBacklog, TopicPartition
from outboxkit.relay.stuck import AVOID_BOUNDS, StuckBlocks, is_stuck
from tests.unit.relay_engine_harness import TOPIC, tp
from tests.unit.relay_parts import Metrics, settings

BOUND = 30.0
NOW = 10_000.0  # monotonic
WALL = 1_800_000_000.0


@dataclass
class Worker:
    """What the check reads of a block worker."""

    block: Block
    tps: list[TopicPartition]
    started_at: float = NOW - 1_000
    last_success: float | None = NOW - 1_000
    failing_since: float | None = None
    stage: str | None = None
    stage_since: float = 0.0
    last_error: str | None = None


def _backlog(
    pending: int, age: float, *tps: TopicPartition
) -> dict[TopicPartition, PartitionBacklog]:
    oldest = datetime.fromtimestamp(WALL - age, UTC)
    return {t: PartitionBacklog(t.topic, t.partition, pending, oldest, 0, None) for t in tps}


def _stuck(worker: Worker, backlog: dict[TopicPartition, PartitionBacklog] | None) -> bool:
    return is_stuck(worker, backlog, BOUND, now=NOW, wall=WALL)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "stuck"),
    [
        ("a send running for the bound", True),
        ("a retried error", True),
        ("never published since it started, retrying", True),
        ("published lately", False),
        ("records younger than the bound", False),
        ("nothing pending", False),
        ("waiting, neither failing nor in a stage (a key held by a parked record)", False),
        ("a stage running, but shorter than the bound", False),
        ("the backlog not measured (the database does not answer)", False),
    ],
)
def test_a_block_is_stuck_when_its_records_wait_and_it_tries_without_progress(
    case: str, stuck: bool
) -> None:
    worker = Worker(Block(TOPIC, 0, 1), [tp(0), tp(1)], stage="send", stage_since=NOW - BOUND)
    backlog: dict[TopicPartition, PartitionBacklog] | None = _backlog(5, BOUND, tp(1))
    if case == "a retried error":
        worker.stage, worker.failing_since = None, NOW - 1
    elif case == "never published since it started, retrying":
        worker.last_success, worker.started_at = None, NOW - BOUND
    elif case == "published lately":
        worker.last_success = NOW - 1
    elif case == "records younger than the bound":
        backlog = _backlog(5, BOUND - 1, tp(1))
    elif case == "nothing pending":
        backlog = _backlog(0, 0, tp(0), tp(1))
    elif case.startswith("waiting"):
        worker.stage = None
    elif case.startswith("a stage running, but"):
        worker.stage_since = NOW - 1
    elif case.startswith("the backlog not measured"):
        backlog = None
    assert _stuck(worker, backlog) is stuck


@dataclass
class Blocks:
    workers: list[Worker] = field(default_factory=list)


class Group:
    def __init__(self) -> None:
        self.steps: list[str] = []

    async def step_aside_from(self, partitions: frozenset[TopicPartition]) -> None:
        self.steps.append(f"aside from {sorted(map(str, partitions))}")

    def avoid_nothing(self) -> None:
        self.steps.append("avoid nothing")

    async def step_aside(self) -> None:
        self.steps.append("out")

    def step_in(self) -> None:
        self.steps.append("in")


async def test_a_relay_says_once_that_partitions_are_stuck_and_steps_aside_from_them() -> None:
    """Would catch a relay that keeps stuck partitions, logs a line per check, rejoins again
    and again for partitions the group gave back, or keeps its request for good."""
    stuck = Worker(Block(TOPIC, 2, 1), [tp(2), tp(3)], stage="send", stage_since=NOW - BOUND)
    fine = Worker(Block(TOPIC, 0, 1), [tp(0), tp(1)], last_success=NOW - 0.1)
    blocks = Blocks([fine, stuck])
    backlog = _backlog(5, BOUND, tp(0), tp(3))
    metrics, group = Metrics(), Group()
    check = StuckBlocks(
        blocks,  # type: ignore[arg-type]
        lambda: backlog,
        group,
        settings(step_aside_after=BOUND),
        metrics.relay,
    )
    with structlog.testing.capture_logs() as logs:
        await check.check(NOW, WALL)
    assert check.stuck == {tp(2), tp(3)}
    assert metrics.value("outboxkit_relay_stuck_partitions") == 2
    assert group.steps == ["aside from ['" + TOPIC + "/2', '" + TOPIC + "/3']"]
    assert [e["event"] for e in logs] == [
        "partitions have records pending and no progress: stepping aside from them so that "
        "another relay publishes them"
    ]
    blocks.workers = [fine]  # the rebalance gave them to another relay
    with structlog.testing.capture_logs() as logs:
        await check.check(NOW + 2, WALL + 2)
    assert (check.stuck, metrics.value("outboxkit_relay_stuck_partitions")) == (frozenset(), 0)
    assert [e["event"] for e in logs] == ["no partition of this relay is stuck any more"]
    await check.check(NOW + AVOID_BOUNDS * BOUND, WALL)
    assert group.steps[-1] == "avoid nothing"


async def test_given_back_what_it_cannot_publish_a_relay_leaves_until_its_request_lapses() -> None:
    """relay-0 cut from the broker its blocks' transactions need publishes nothing it is
    given, and the group's ranges leave it one: given back the partitions it asked to avoid, it
    leaves the group (the others publish everything), says so and shows them, and rejoins when
    its request lapses. Before, it stepped aside from one range, was given the other, and so on:
    a rebalance per bound, and a range always waiting."""
    low = Worker(Block(TOPIC, 0, 1), [tp(0), tp(1)], stage="send", stage_since=NOW - BOUND)
    blocks = Blocks([low])
    backlog = _backlog(5, BOUND, tp(0), tp(1), tp(2), tp(3))
    metrics, group = Metrics(), Group()
    check = StuckBlocks(
        blocks,  # type: ignore[arg-type]
        lambda: backlog,
        group,
        settings(step_aside_after=BOUND),
        metrics.relay,
    )
    await check.check(NOW, WALL)
    high = Worker(Block(TOPIC, 2, 1), [tp(2), tp(3)], stage="send", stage_since=NOW - BOUND)
    blocks.workers = [high]  # given the other range: stuck too
    await check.check(NOW + BOUND + 1, WALL)
    blocks.workers = [low]  # and back the first, which it asked to avoid
    with structlog.testing.capture_logs() as logs:
        await check.check(NOW + 2 * BOUND + 2, WALL)
    assert group.steps[-1] == "out"
    assert [e["event"] for e in logs] == [
        "given back partitions it cannot publish: leaving the group so that the other relays "
        "publish them all"
    ]
    blocks.workers = []
    await check.check(NOW + 2 * BOUND + 3, WALL)
    assert check.showing() == {tp(0), tp(1), tp(2), tp(3)}
    assert metrics.value("outboxkit_relay_stuck_partitions") == 4
    await check.check(NOW + BOUND + 1 + AVOID_BOUNDS * BOUND, WALL)
    assert group.steps[-2:] == ["avoid nothing", "in"]
    assert not check.out


def test_the_assignor_gives_no_member_a_range_it_asked_to_avoid_when_another_can_take_it() -> None:
    members = ["a", "b", "c"]
    assert avoiding(6, members, {}) == split(6, members)
    # b avoids partition 3 (its usual range 2-3): it gets 4-5, c gets 2-3.
    assert avoiding(6, members, {"b": frozenset({3})}) == {
        "a": range(0, 2),
        "c": range(2, 4),
        "b": range(4, 6),
    }
    # every member avoids it: someone still owns it
    everyone = dict.fromkeys(members, frozenset({3}))
    given = avoiding(6, members, everyone)
    assert sorted(given.values(), key=lambda r: r.start) == [range(0, 2), range(2, 4), range(4, 6)]


def test_a_member_asks_in_its_metadata_and_the_leader_reads_it_or_ignores_garbage() -> None:
    mine = BlockAssignor()
    assert mine.metadata([TOPIC]).user_data == b""  # constant while it avoids nothing
    mine.avoid = {TOPIC: frozenset({3})}
    asked = mine.metadata([TOPIC])
    assert json.loads(asked.user_data) == {"avoid": {TOPIC: [3]}}

    class Cluster:
        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(6))

    members = {
        "a": ConsumerProtocolMemberMetadata(0, [TOPIC], b""),
        "b": asked,
        "c": ConsumerProtocolMemberMetadata(0, [TOPIC], b"not json"),
    }
    assignment = BlockAssignor.assign(Cluster(), members)
    assert dict(assignment["b"].assignment) == {TOPIC: [4, 5]}
    assert dict(assignment["c"].assignment) == {TOPIC: [2, 3]}
