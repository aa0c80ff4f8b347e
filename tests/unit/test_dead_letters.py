"""Dead-lettering is at least once (a worker that dies between writing a dead letter and
committing its offset writes it again, docs/inbox.md#dead-letters): every copy of one
dead-lettering carries the same dedupe key, and a replayed event that fails again is a new one.
A replay goes where the dead-letter topic belongs, never where a (forgeable) header says."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from aiokafka.structs import ConsumerRecord

from outboxkit.inbox import (
    DeadLetter,
    DeadLetterError,
    DeadLetterReplay,
    replay_targets,
    unique_dead_letters,
)
from outboxkit.inbox.deadletter import ADDED, SOURCE_PARTITION, SOURCE_TOPIC, dead_letter
from outboxkit.inbox.deadletter_topic import _with_replays, origin_topic


def _record(offset: int, headers: list[tuple[str, bytes]]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("orders", 2, offset, 0, 0, b"c-1", b"{}", None, 3, 2, headers)


def _letter(record: ConsumerRecord[bytes, bytes], dlq_offset: int) -> DeadLetter:
    copy = dead_letter(
        record,
        inbox="payments",
        reason="handler_failed",
        error=ValueError("declined"),
        max_bytes=1_000_000,
    )
    return DeadLetter(
        "orders.dlq", 2, dlq_offset, datetime.now(UTC), copy.key, copy.value, tuple(copy.headers)
    )


def test_copies_of_one_dead_lettering_share_the_dedupe_key() -> None:
    record = _record(41, [("ce_id", b"0b7e6b8e-0000-4000-8000-000000000001")])
    first, again = _letter(record, 0), _letter(record, 1)  # the worker died before its commit
    assert first.dedupe_key == again.dedupe_key == ("payments", "orders", "2", "41")
    assert unique_dead_letters([first, again]) == [first]


def test_a_replayed_event_that_fails_again_is_a_new_dead_letter() -> None:
    record = _record(41, [("ce_id", b"0b7e6b8e-0000-4000-8000-000000000001")])
    first = _letter(record, 0)
    # A replay publishes the original headers (without outboxkit's) at a new source offset.
    replayed = _record(97, [(n, v) for n, v in first.headers if n not in ADDED])
    second = _letter(replayed, 1)
    assert first.event_id == second.event_id
    assert first.dedupe_key != second.dedupe_key
    assert unique_dead_letters([first, second]) == [first, second]


def test_a_replay_marker_marks_every_copy_of_its_dead_lettering_and_nothing_else() -> None:
    """``dlq list`` leaves out, and ``dlq replay`` does not replay again unasked, what a replay's
    marker (in the dead-letter topic, after the dead letter) names: the dead letter it replayed
    and its copies (the replay published the dead-lettering once), not a later dead letter of
    the same event (a replay that failed again)."""
    record = _record(41, [("ce_id", b"0b7e6b8e-0000-4000-8000-000000000001")])
    first, copy = _letter(record, 0), _letter(record, 1)
    later = _letter(_record(97, [("ce_id", b"0b7e6b8e-0000-4000-8000-000000000001")]), 2)
    when = datetime(2026, 12, 7, tzinfo=UTC)
    marked = _with_replays(
        [first, copy, later], {("orders.dlq", 2, 0): [DeadLetterReplay("orders/2@97", when)]}
    )
    assert [d.replays for d in marked] == [(DeadLetterReplay("orders/2@97", when),)] * 2 + [()]
    assert marked[0].summary()["replayed"] == [{"to": "orders/2@97", "at": when.isoformat()}]


def _forged(topic: str, headers: dict[str, str]) -> DeadLetter:
    raw = tuple((name, value.encode()) for name, value in headers.items())
    return DeadLetter(topic, 0, 7, datetime.now(UTC), b"k", b"{}", raw)


def test_a_replay_goes_where_the_dead_letter_topic_belongs_whatever_a_header_says() -> None:
    honest = _letter(_record(41, []), 0)
    forged = _forged("orders.dlq", {SOURCE_TOPIC: "payments", SOURCE_PARTITION: "1"})
    [a, b] = replay_targets([honest, forged], dlq_suffix=".dlq")
    assert (a.topic, a.partition, a.misdirected) == ("orders", 2, None)
    assert (b.topic, b.partition, b.misdirected) == ("orders", 1, "payments")
    # --to names the topic; the source partition of another topic means nothing there.
    [c, d] = replay_targets([honest, forged], dlq_suffix=".dlq", to="orders-again")
    assert (c.topic, c.partition, c.misdirected) == ("orders-again", None, None)
    assert (d.topic, d.partition, d.misdirected) == ("orders-again", None, "payments")


def test_a_replay_refuses_what_it_cannot_place() -> None:
    no_partition = _forged("orders.dlq", {SOURCE_TOPIC: "orders", SOURCE_PARTITION: "-1"})
    with pytest.raises(DeadLetterError, match=r"no source partition header on orders.dlq/0@7"):
        replay_targets([no_partition], dlq_suffix=".dlq")
    assert replay_targets([no_partition], dlq_suffix=".dlq", to="orders")[0].partition is None
    with pytest.raises(DeadLetterError, match="orders is not a dead-letter topic"):
        replay_targets([_forged("orders", {})], dlq_suffix=".dlq")
    assert origin_topic("orders.dlq.dlq", ".dlq") == "orders.dlq"
