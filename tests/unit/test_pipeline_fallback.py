"""The decoder's Python pass (outboxkit.pipeline.fallback) on Arrow arrays, without Spark."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")
pa = pytest.importorskip("pyarrow", reason="the Spark pipeline needs the [spark] extra")

from pydantic import Field  # noqa: E402

from outboxkit.pipeline.fallback import UNREPRESENTABLE, PythonDecoder, decode_rows  # noqa: E402
from outboxkit.schemas import Event, EventRegistry, encode  # noqa: E402

WHEN = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)
HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])


class Huge(Event, type="test.huge", topic="t", key_field="name"):
    name: str
    amount: Decimal = Field(decimal_places=2)


def registry() -> EventRegistry:
    local = EventRegistry()
    local.register(Huge)
    return local


def run(decoder: PythonDecoder, events: list[Event], flags: list[bool]) -> list[dict[str, Any]]:
    wires = [encode(e, source="urn:test") for e in events]
    result = decode_rows(
        decoder,
        pa.array(flags),
        pa.array([w.key for w in wires], pa.binary()),
        pa.array([w.value for w in wires], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in w.headers] for w in wires], pa.list_(HEADER)),
        pa.array([w.topic for w in wires]),
    )
    rows: list[dict[str, Any]] = result.to_pylist()
    return rows


def test_an_event_that_does_not_fit_its_column_is_quarantined_alone() -> None:
    fits = Huge(name="a", amount=Decimal("1.25"), occurred_at=WHEN)
    too_big = Huge(name="b", amount=Decimal("1" * 40 + ".00"), occurred_at=WHEN)
    rows = run(PythonDecoder(registry()), [fits, too_big], [True, True])
    assert rows[0]["error_reason"] is None
    assert rows[0]["test_huge_v1"]["amount"] == Decimal("1.25")
    assert rows[0]["event_id"] == str(fits.id)
    assert rows[1]["error_reason"] == UNREPRESENTABLE
    assert "test_huge_v1" in rows[1]["error_message"]
    assert rows[1]["test_huge_v1"] is None


def test_rows_the_jvm_decided_are_left_null() -> None:
    event = Huge(name="a", amount=Decimal("1.25"), occurred_at=WHEN)
    assert run(PythonDecoder(registry()), [event, event], [False, False]) == [None, None]
    assert run(PythonDecoder(registry()), [event, event], [False, True])[0] is None


def test_the_decoder_survives_pickling() -> None:
    decoder = PythonDecoder(registry())
    _ = decoder.arrow_type
    copy = pickle.loads(pickle.dumps(decoder))
    (row,) = run(copy, [Huge(name="a", amount=Decimal("1.25"), occurred_at=WHEN)], [True])
    assert row["error_reason"] is None


def test_the_writers_traceparent_stays_available_on_a_decoded_row() -> None:
    """docs/tracing.md: the event's headers column keeps the traceparent (the Python pass)."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    event = Huge(
        name="a", amount=Decimal("1.25"), occurred_at=WHEN, headers={"traceparent": traceparent}
    )
    (row,) = run(PythonDecoder(registry()), [event], [True])
    assert dict(row["test_huge_v1"]["headers"])["traceparent"] == traceparent
