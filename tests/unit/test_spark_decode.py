"""Decoding Kafka records on Arrow batches (outboxkit.inbox.spark.decode), without Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")
pa = pytest.importorskip("pyarrow", reason="the Spark pipeline needs the [spark] extra")

from pydantic import Field  # noqa: E402

from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, registry  # noqa: E402
from outboxkit.inbox.spark.decode import UNREPRESENTABLE, RecordDecoder  # noqa: E402
from outboxkit.schemas import Event, EventRegistry, encode  # noqa: E402

WHEN = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)


def _order(**changes: Any) -> OrderPlaced:
    fields: dict[str, Any] = {
        "order_id": "o-1",
        "customer_id": "c-1",
        "currency": Currency.EUR,
        "lines": [OrderLine(sku="s", quantity=2, unit_price=Decimal("4.50"))],
        "amount": Decimal("9.00"),
        "occurred_at": WHEN,
    }
    return OrderPlaced(**(fields | changes))


def _record(
    value: bytes | None, headers: list[tuple[str, bytes]], key: bytes = b"c-1", offset: int = 0
) -> dict[str, Any]:
    return {
        "key": key,
        "value": value,
        "topic": "shop.orders",
        "partition": 0,
        "offset": offset,
        "timestamp": WHEN,
        "timestampType": 0,
        "headers": [{"key": k, "value": v} for k, v in headers],
    }


def _wire(event: Event) -> dict[str, Any]:
    wire = encode(event, source="urn:test")
    return _record(wire.value, list(wire.headers), key=wire.key)


def _decode(decoder: RecordDecoder, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    source = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(header)),
        ]
    )
    batch = pa.RecordBatch.from_pylist(records, schema=source)
    (out,) = list(decoder(iter([batch])))
    assert out.schema == decoder.arrow_schema
    rows: list[dict[str, Any]] = out.to_pylist()
    return rows


def test_a_valid_event_becomes_a_typed_struct_and_loses_its_raw_bytes() -> None:
    event = _order(note="gift")
    (row,) = _decode(RecordDecoder(registry), [_wire(event)])
    assert row["error_reason"] is None
    assert row["event_id"] == str(event.id)
    assert row["event_type"] == "shop.order_placed"
    assert row["event_version"] == 1
    assert row["event_key"] == "c-1"
    assert row["occurred_at"] == WHEN
    assert row["value"] is None
    assert row["headers"] is None
    assert row["shop_payment_captured_v1"] is None
    order = row["shop_order_placed_v1"]
    assert order["currency"] == "EUR"
    assert order["amount"] == Decimal("9.00")
    assert order["lines"] == [{"sku": "s", "quantity": 2, "unit_price": Decimal("4.50")}]
    assert order["note"] == "gift"
    assert order["id"] == str(event.id)


def test_the_writers_traceparent_stays_available_on_a_decoded_row() -> None:
    """Trace propagation (docs/tracing.md): the pipeline keeps the record's traceparent in the
    event's headers column, so a job can attach its work to the writer's trace."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    record = _wire(_order())
    record["headers"].append({"key": "traceparent", "value": traceparent.encode()})
    (row,) = _decode(RecordDecoder(registry), [record])
    assert row["error_reason"] is None
    assert dict(row["shop_order_placed_v1"]["headers"])["traceparent"] == traceparent


def test_bad_records_keep_their_bytes_and_say_why() -> None:
    good = _wire(_order())
    headers = [(h["key"], h["value"]) for h in good["headers"]]
    unknown = [(k, b"shop.nothing" if k == "ce_type" else v) for k, v in headers]
    version_2 = [(k, b"2" if k == "ce_schemaversion" else v) for k, v in headers]
    negative = _wire(_order()) | {"value": good["value"].replace(b'"9.00"', b'"-1.00"')}
    records = [
        _record(b"not json", headers, offset=1),
        _record(b"{}", [], offset=2),
        _record(good["value"], unknown, offset=3),
        _record(good["value"], version_2, offset=4),
        negative | {"offset": 5},
        _record(good["value"], headers, key=b"", offset=6),
    ]
    rows = _decode(RecordDecoder(registry), records)
    assert [r["error_reason"] for r in rows] == [
        "invalid_value",
        "missing_header",
        "unknown_type",
        "unsupported_version",
        "invalid_payload",
        "invalid_key",
    ]
    for row, record in zip(rows, records, strict=True):
        assert row["value"] == record["value"]
        assert row["offset"] == record["offset"]
        assert row["error_type"] == "EventDecodeError"
        assert row["error_message"]
        assert row["event_id"] is None
        assert row["shop_order_placed_v1"] is None
    assert rows[0]["headers"] == records[0]["headers"]


class _Huge(Event, type="test.huge", topic="t", key_field="name"):
    name: str
    amount: Decimal = Field(decimal_places=2)


def test_an_event_that_does_not_fit_its_column_is_quarantined_alone() -> None:
    local = EventRegistry()
    local.register(_Huge)
    fits = _wire(_Huge(name="a", amount=Decimal("1.25")))
    too_big = _wire(_Huge(name="b", amount=Decimal("1" * 40 + ".00")))
    rows = _decode(RecordDecoder(local), [fits, too_big])
    assert rows[0]["error_reason"] is None
    assert rows[0]["test_huge_v1"]["amount"] == Decimal("1.25")
    assert rows[1]["error_reason"] == UNREPRESENTABLE
    assert "test_huge_v1" in rows[1]["error_message"]
    assert rows[1]["value"] == too_big["value"]
    assert rows[1]["test_huge_v1"] is None


def test_the_decoder_survives_pickling() -> None:
    import pickle  # noqa: PLC0415

    decoder = RecordDecoder(registry)
    _ = decoder.arrow_schema
    copy = pickle.loads(pickle.dumps(decoder))
    (row,) = _decode(copy, [_wire(_order())])
    assert row["error_reason"] is None
