"""The failover harness's checks fail when the guarantee they stand for broke: G4 from the
producer sessions of committed records, G6 from effects, the gaps per fault, and the
``__consumer_offsets`` partition the harness picks relay names by (tests/failover)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from tests.failover.arrivals import Arrival
from tests.failover.baseline import (
    QUIET_FLOOR,
    QUIET_P50,
    QUIET_RATE,
    STEP,
    WINDOW,
    Timeline,
    first_back,
    measure,
)
from tests.failover.harness import _offsets_partition, check_effects_once
from tests.failover.publishers import check_one_publisher
from tests.failover.report import Fault, Report, gaps
from tests.failover.worker_logs import LIMIT, excerpt, excerpts

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


def _timeline(delay_at: Callable[[float], float], until: float, rate: float = 20.0) -> Timeline:
    """Events committed ``rate`` a second from 0 to ``until``, each on Kafka after
    ``delay_at(its commit time)`` seconds, and in effect 10 ms later."""
    committed, arrivals, effects = {}, {}, {}
    for n in range(int(until * rate)):
        event, at = uuid.uuid4(), n / rate
        committed[event] = at
        arrivals[event] = Arrival(at + delay_at(at), at, 0, n)
        effects[event] = at + delay_at(at) + 0.01
    return Timeline(committed, arrivals, effects)


def test_the_first_window_back_is_the_first_as_fast_as_before_the_fault() -> None:
    """Fast (10 ms) before a fault at 10 s; healed at 12 s; events committed until 15 s wait
    2 s; from 15 s on they are fast again: the first window back starts at 15 s."""

    def delay(at: float) -> float:
        return 0.01 if at < 10 or at >= 15 else 2.0

    timeline = _timeline(delay, 30.0)
    baseline = measure(timeline, 10 - WINDOW, now=40.0)
    assert baseline.delivery_p99 == pytest.approx(0.01)
    assert baseline.events == int(WINDOW * 20)
    back = first_back(timeline, baseline, healed=12.0, until=27.0, now=40.0)
    assert back is not None
    assert back.start == 15.0
    assert back.delivery_p50 == pytest.approx(0.01)
    assert first_back(timeline, baseline, healed=12.0, until=15.0 + WINDOW - STEP, now=40.0) is None


def test_a_relay_that_publishes_on_its_sweep_is_never_back() -> None:
    """After the fault every event waits for a 1 s sweep: a quiet window's p99 ~1 s, over the
    quiet floor and twice the baseline: not back, however long the bound."""

    def delay(at: float) -> float:
        return 0.01 if at < 10 else 1.0 - (at % 1.0)

    timeline = _timeline(delay, 60.0)
    baseline = measure(timeline, 10 - WINDOW, now=70.0)
    assert first_back(timeline, baseline, healed=10.0, until=60.0, now=70.0, load="quiet") is None


def test_a_relay_that_sweeps_half_the_partitions_is_never_back() -> None:
    """One relay of two woken on commit, the other only by its sweep: half the events wait up
    to 1 s, the p99 is over the quiet floor."""

    def delay(at: float) -> float:
        return 0.01 if at < 10 or int(at * 20) % 2 else 1.0 - (at % 1.0)

    timeline = _timeline(delay, 60.0)
    baseline = measure(timeline, 10 - WINDOW, now=70.0)
    assert first_back(timeline, baseline, healed=10.0, until=60.0, now=70.0, load="quiet") is None


@pytest.mark.parametrize(
    ("after", "back"),
    [
        (0.09, True),  # woken on commit on a loaded machine: twice as slow, under QUIET_P50
        (0.15, False),  # waits 150 ms before it publishes: every p99 within the quiet floor
        (0.5, False),  # a sweep-only relay's p50
    ],
)
def test_a_quiet_window_is_back_with_its_p50_under_the_floor_or_twice_the_baseline(
    after: float, back: bool
) -> None:
    """Quiet, a p99 under :data:`QUIET_FLOOR` does not make a window back: its p50 must be
    within twice the baseline's or under :data:`QUIET_P50` too."""
    timeline = _timeline(lambda at: 0.04 if at < 10 else after, 30.0, rate=QUIET_RATE)
    baseline = measure(timeline, 10 - WINDOW, now=40.0)
    assert after < QUIET_FLOOR or not back
    found = first_back(timeline, baseline, healed=10.0, until=30.0, now=40.0, load="quiet")
    assert (found is not None) is back
    assert after > QUIET_P50 or back


def test_an_event_not_on_kafka_yet_counts_as_late_by_its_age() -> None:
    timeline = _timeline(lambda at: 0.01, 10.0)
    missing = next(iter(timeline.committed_at))
    arrivals = {e: a for e, a in timeline.arrivals.items() if e != missing}
    window = measure(Timeline(timeline.committed_at, arrivals), 0.0, now=100.0)
    assert window.delivery_p99 == 100.0
    assert not window.within(measure(timeline, 0.0, now=100.0))


def test_the_baseline_is_what_was_on_kafka_when_the_fault_began() -> None:
    """An event committed just before the fault and held up by it is not counted at the delay
    the fault gave it: the baseline is measured as of the fault's start."""
    timeline = _timeline(lambda at: 5.0 if at >= 9.5 else 0.01, 20.0)
    baseline = measure(timeline, 10.0 - WINDOW, now=10.0)
    assert baseline.delivery_p99 <= 0.5


def test_a_failed_gap_prints_what_the_workers_logged_during_that_fault() -> None:
    """The report alone says where a slow fault's time went: the lines each process logged
    within the fault's window, relative to its start, repeats folded, nothing from before."""
    start = datetime(2026, 12, 7, 23, 51, 0, tzinfo=UTC).timestamp()

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(start + seconds, UTC).isoformat().replace("+00:00", "Z")

    log = "\n".join(
        [
            f"{at(-5)} [info     ] partitions assigned            [outboxkit.relay] gained=[]",
            f"{at(0.4)} [warning  ] retrying after error           [outboxkit.relay] attempt=1",
            "Traceback (most recent call last):",
            f"{at(0.9)} [warning  ] retrying after error           [outboxkit.relay] attempt=1",
            f"{at(30.2)} [warning  ] slow relay stage               [outboxkit.relay] stage=fence",
            f"{at(99)} [info     ] partitions assigned            [outboxkit.relay] gained=[]",
        ]
    )
    logged = excerpts([("relay-1", log)], start, start + 40.0)
    assert logged == (
        "relay-1 +0.4 s: [warning  ] retrying after error           [outboxkit.relay] "
        "attempt=1 (2 times)",
        "relay-1 +30.2 s: [warning  ] slow relay stage               [outboxkit.relay] stage=fence",
    )
    assert (
        len(
            excerpt(
                "r", "\n".join(f"{at(i)} [info] line {i}" for i in range(30)), start, start + 40
            )
        )
        == LIMIT + 1
    )

    slow = gaps(
        Fault("group coordinator", started=start, recovered=start + 40.0),
        {uuid.uuid4(): start},
        {},
        {},
        logged=logged,
    )
    report = Report(faults=[replace(slow, delivery=31.7)])
    with pytest.raises(
        AssertionError, match=r"(?s)gaps over 30.0 s.*logged during group coordinator.*stage=fence"
    ):
        report.assert_ok(max_gap=30.0)
