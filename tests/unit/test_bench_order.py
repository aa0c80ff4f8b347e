"""The relay bench's per-key order check (G2, bench/relay_bench/order.py): allowed and forbidden
sequences as they would be read back from a topic."""

from __future__ import annotations

import pytest

from bench.relay_bench.harness import SEQ_PLACEHOLDER, with_seq
from bench.relay_bench.order import KeySequences, Published, Violation, order_violations


def topic(*partitions: list[tuple[str, int]]) -> list[Published]:
    """Records per partition in offset order: (key, seq) each."""
    return [
        Published(partition, offset, key, seq)
        for partition, records in enumerate(partitions)
        for offset, (key, seq) in enumerate(records)
    ]


def one_key(*seqs: int) -> list[Published]:
    return topic([("R", seq) for seq in seqs])


@pytest.mark.parametrize(
    "seqs",
    [
        (),
        (0,),
        (0, 1, 2, 3),
        (0, 1, 1, 2),  # a re-delivery of the latest in-flight event
        (0, 0, 0, 1, 1, 2, 2),
        (0, 2, 5),  # gaps are missing events, not disorder
        (3, 4),  # the first events were read by an earlier phase
    ],
)
def test_in_order_sequences_pass(seqs: tuple[int, ...]) -> None:
    assert order_violations(one_key(*seqs)) == []


@pytest.mark.parametrize(
    ("seqs", "bad", "repeated"),
    [
        ((0, 1, 2, 1), 1, True),  # a re-delivery of an event older than the latest
        ((0, 2, 1), 1, False),  # a first appearance out of commit order
        ((1, 0), 0, False),
        ((0, 1, 2, 3, 0), 0, True),
    ],
)
def test_out_of_order_sequences_fail(seqs: tuple[int, ...], bad: int, repeated: bool) -> None:
    [violation] = order_violations(one_key(*seqs))
    assert violation.key == "R"
    assert violation.seqs[-1] == bad
    assert violation.offset == len(seqs) - 1
    assert violation.latest == max(seqs[:-1])
    assert violation.repeated is repeated


def test_every_record_that_goes_back_counts() -> None:
    violations = order_violations(one_key(0, 3, 1, 2, 4))
    assert [v.seqs[-1] for v in violations] == [1, 2]
    assert all(v.latest == 3 for v in violations)


def test_keys_are_checked_apart_and_across_partitions() -> None:
    records = topic(
        [("A", 0), ("B", 5), ("A", 1), ("B", 6)],
        [("C", 1), ("D", 0), ("C", 0)],
    )
    [violation] = order_violations(records)
    assert (violation.key, violation.partition, violation.offset) == ("C", 1, 2)


def test_records_are_put_in_partition_offset_order_first() -> None:
    records = one_key(0, 1, 2)
    assert order_violations(list(reversed(records))) == []


def test_a_violation_names_the_key_and_shows_its_sequence() -> None:
    [violation] = order_violations(one_key(*range(10), 7))
    assert violation == Violation("R", 0, 10, 9, True, (5, 6, 7, 8, 9, 7))
    assert str(violation) == (
        "key R (partition 0, offset 10): seq 7 re-delivered after seq 9: …5, 6, 7, 8, 9, 7"
    )


def test_key_sequences_count_each_key_from_zero() -> None:
    sequences = KeySequences()
    taken = [sequences.take(key) for key in ("a", "b", "a", "a", "b")]
    assert taken == [0, 0, 1, 2, 1]


def test_with_seq_renumbers_an_event_written_with_seq_zero() -> None:
    value = b'{"note":"x",' + SEQ_PLACEHOLDER
    assert with_seq(value, 42) == b'{"note":"x","seq":42}'
    with pytest.raises(ValueError, match="seq=0"):
        with_seq(b'{"note":"x","seq":1}', 2)
