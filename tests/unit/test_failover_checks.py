"""The failover harness's checks fail when the guarantee they stand for broke: G4 from the
producer sessions of committed records, G6 from effects, the gaps per fault, and the
``__consumer_offsets`` partition the harness picks relay names by (tests/failover)."""

from __future__ import annotations

import uuid

import pytest

from tests.failover.arrivals import Arrival
from tests.failover.harness import _offsets_partition, check_effects_once
from tests.failover.publishers import check_one_publisher
from tests.failover.report import Fault, gaps

A, A_NEXT, B = (7, 0), (7, 1), (9, 0)


def test_g4_holds_when_each_producer_session_publishes_one_run() -> None:
    sessions = {0: {0: A, 1: A, 3: A_NEXT, 4: B, 6: B}}  # 2 and 5: transaction markers
    assert "3 publisher sessions" in check_one_publisher({0: [0, 1, 3, 4, 6]}, sessions)


def test_g4_fails_when_an_older_session_publishes_after_a_newer_one() -> None:
    """A zombie: producer A's epoch 0 commits again after B took the partition."""
    sessions = {0: {0: A, 1: B, 2: A}}
    with pytest.raises(AssertionError, match="G4 violated on partition 0"):
        check_one_publisher({0: [0, 1, 2]}, sessions)


def test_g6_fails_on_an_effect_twice_missing_or_unpublished() -> None:
    one, two = uuid.uuid4(), uuid.uuid4()
    assert check_effects_once({one: [1.0], two: [2.0]}, {one, two})
    for effects, published in [
        ({one: [1.0, 1.5], two: [2.0]}, {one, two}),
        ({one: [1.0]}, {one, two}),
        ({one: [1.0], two: [2.0]}, {one}),
    ]:
        with pytest.raises(AssertionError, match="G6 violated"):
            check_effects_once(effects, published)


def test_gaps_are_the_longest_delays_of_the_events_committed_during_the_fault() -> None:
    early, held, late = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    committed = {early: 0.0, held: 10.0, late: 100.0}
    arrivals = {
        e: Arrival(at + d, at + d - 0.5, 0, i)
        for i, (e, at, d) in enumerate([(early, 0.0, 50.0), (held, 10.0, 7.0), (late, 100.0, 1.0)])
    }
    effects = {early: 60.0, held: 18.0, late: 101.5}
    result = gaps(Fault("kill", started=9.5, recovered=30.0), committed, arrivals, effects)
    assert (result.events, result.delivery, result.sent) == (1, 7.0, 6.5)
    assert (result.inbox, result.end_to_end) == (1.0, 8.0)


def test_offsets_partition_is_javas_string_hash() -> None:
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE: Kafka's Utils.abs makes it 0.
    assert _offsets_partition("polygenelubricants", 1 << 31) == 0
    assert _offsets_partition("abc", 1 << 31) == 96354
