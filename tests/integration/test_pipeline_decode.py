"""The pipeline's decoder (JVM first, the registry for the rest) against the Python decoder.

One corpus of good and garbage records goes through both: ``outboxkit.pipeline.decode`` in
Spark, and ``EventRegistry.decode`` (the inbox's decoder) record by record. Every record must
get the same outcome — the same typed event, or quarantine with the same reason — and every
canonical record of a supported model must be decided on the JVM (no Python per event).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent
from pydantic import BaseModel, Field, field_validator

from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured
from outboxkit.demo.events import registry as shop
from outboxkit.schemas import Event, EventDecodeError, EventRegistry, encode

pyspark = pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")
pa = pytest.importorskip("pyarrow")

from outboxkit.pipeline import decode, jvm_decodable  # noqa: E402
from outboxkit.pipeline.fallback import PythonDecoder, decode_rows  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration]

WHEN = datetime(2026, 3, 1, 10, 30, 15, 250000, tzinfo=UTC)
SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)
Headers = list[tuple[str, bytes | None]]
Record = tuple[bytes | None, bytes | None, Headers]


class Tags(BaseModel):
    labels: list[str] = Field(min_length=1)
    weight: float = Field(ge=0)
    rank: int | None = None


class Shipped(Event, type="test.shipped", version=2, topic="t", key_field="order_id"):
    order_id: str = Field(min_length=2, max_length=8)
    tags: Tags
    shipped_on: datetime
    parcel: int = Field(gt=0, le=1000)
    price: Decimal = Field(max_digits=5, decimal_places=2)


class Validated(Event, type="test.validated", topic="t", key_field="name"):
    """A user validator: Spark SQL cannot run it, so this model is decoded in Python."""

    name: str

    @field_validator("name")
    @classmethod
    def _no_x(cls, value: str) -> str:
        if "x" in value:
            raise ValueError("no x")
        return value


class Strict(Event, type="test.strict", topic="t", key_field="name", strict_reader=True):
    """Rejects fields it does not declare when decoding (every other model ignores them)."""

    name: str


class ParcelV1(Event, type="test.parcel", version=1, topic="t", key_field="parcel_id"):
    parcel_id: str
    grams: int


class ParcelV2(Event, type="test.parcel", version=2, topic="t", key_field="parcel_id"):
    parcel_id: str
    kilograms: Decimal


def parcel_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    grams = payload.pop("grams")
    return {**payload, "kilograms": str(Decimal(grams) / 1000)}


def registry() -> EventRegistry:
    local = EventRegistry()
    for model in (*shop, Shipped, Validated, Strict, ParcelV1, ParcelV2):
        local.register(model)
    # Registered with ParcelV1 too: the upcaster wins, v1 records are read as ParcelV2.
    local.upcaster(ParcelV2, from_version=1)(parcel_v1_to_v2)
    return local


def order(**changes: Any) -> OrderPlaced:
    fields: dict[str, Any] = {
        "order_id": "o-1",
        "customer_id": "c-1",
        "currency": Currency.EUR,
        "lines": [OrderLine(sku="s", quantity=2, unit_price=Decimal("4.50"))],
        "amount": Decimal("9.00"),
        "occurred_at": WHEN,
        "topic": "t",
    }
    return OrderPlaced(**(fields | changes))


def wire(event: Event) -> Record:
    encoded = encode(event, source="urn:test")
    return encoded.key, encoded.value, list(encoded.headers)


def swap(record: Record, name: str, value: bytes | None) -> Record:
    key, payload, headers = record
    return key, payload, [(k, value if k == name else v) for k, v in headers]


def replace(record: Record, old: bytes, new: bytes) -> Record:
    key, payload, headers = record
    assert payload is not None
    assert old in payload, (old, payload)
    return key, payload.replace(old, new), headers


LINE = b'{"sku":"s","quantity":2,"unit_price":"4.50"}'


def corpus() -> list[tuple[str, Record]]:
    """(label, record): good records, written canonically or not, and garbage."""
    good = wire(order())
    shipped = wire(
        Shipped(
            order_id="o-7",
            tags=Tags(labels=["fragile", 'é "quoted" \\ /'], weight=1.5),
            shipped_on=datetime(2026, 2, 28, 23, 0, tzinfo=UTC),
            parcel=3,
            price=Decimal("123.40"),
            occurred_at=WHEN,
            headers={"trace": "abc", "tenant": "ünï"},
        )
    )
    key, value, headers = good
    assert value is not None
    cases: list[tuple[str, Record]] = [
        # Canonical (what encode writes): decided on the JVM.
        ("good", good),
        (
            "good, note",
            wire(order(note='gift ✓ "x" \\n', occurred_at=datetime(2026, 1, 1, tzinfo=UTC))),
        ),
        (
            "good, many lines",
            wire(
                order(
                    lines=[
                        OrderLine(sku=f"s{i}", quantity=i + 1, unit_price=Decimal(i))
                        for i in range(5)
                    ]
                )
            ),
        ),
        ("good, zero amount", wire(order(amount=Decimal("0"), currency=Currency.USD))),
        (
            "good, payment",
            wire(
                PaymentCaptured(
                    payment_id="p",
                    order_id="o",
                    customer_id="c",
                    currency=Currency.EUR,
                    amount=Decimal("1.5"),
                    occurred_at=WHEN,
                    topic="t",
                )
            ),
        ),
        ("good, nested model and user headers", shipped),
        ("good, validated model", wire(Validated(name="abc", occurred_at=WHEN))),
        ("good, strict model", wire(Strict(name="n", occurred_at=WHEN))),
        ("good, parcel v2", wire(ParcelV2(parcel_id="p", kilograms=Decimal("1.5")))),
        # Read through an upcaster (the Python pass).
        ("parcel v1, upcast to v2", wire(ParcelV1(parcel_id="p", grams=1500))),
        (
            "parcel v1, upcaster fails",
            replace(wire(ParcelV1(parcel_id="p", grams=1)), b'"grams":1', b'"gram":1'),
        ),
        (
            "parcel v1, upcast value invalid",
            replace(wire(ParcelV1(parcel_id="p", grams=1)), b'"grams":1', b'"grams":"x"'),
        ),
        # Fields the reader's model does not declare (a newer producer's): ignored.
        ("extra top-level field", replace(good, b'"note":null', b'"note":null,"x":1')),
        ("extra field in a nested model", replace(shipped, b'"weight":1.5', b'"weight":1.5,"x":1')),
        # Valid, but not canonical: the Python pass decides (and accepts).
        ("amount as a number", replace(good, b'"amount":"9.00"', b'"amount":9.00')),
        ("amount 9.000 (normalises to 2 places)", replace(good, b'"9.00"', b'"9.000"')),
        ("quantity as a string", replace(good, b'"quantity":2', b'"quantity":"2"')),
        ("spaces in the JSON", replace(good, b'","', b'", "')),
        ("note missing", replace(good, b',"note":null', b"")),
        (
            "nested extra key (ignored by OrderLine)",
            replace(good, b'"sku":"s"', b'"sku":"s","x":1'),
        ),
        ("ce_time with an offset", swap(good, "ce_time", b"2026-03-01T12:30:15.25+02:00")),
        ("upper-case ce_id", swap(good, "ce_id", headers[1][1].upper())),  # type: ignore[union-attr]
        (
            "content-type with charset",
            swap(good, "content-type", b"application/json; charset=utf-8"),
        ),
        ("headers in another order", (key, value, list(reversed(headers)))),
        ("an unknown ce_ extension", (key, value, [*headers, ("ce_traceparent", b"00-x")])),
        (
            "no ce_dataschema (an older writer)",
            (key, value, [h for h in headers if h[0] != "ce_dataschema"]),
        ),
        (
            "ce_dataschema first",
            (
                key,
                value,
                [h for h in headers if h[0] == "ce_dataschema"]
                + [h for h in headers if h[0] != "ce_dataschema"],
            ),
        ),
        ("ce_dataschema not UTF-8", swap(good, "ce_dataschema", b"\xff")),
        (
            "validated model rejects",
            replace(wire(Validated(name="abc", occurred_at=WHEN)), b'"abc"', b'"axc"'),
        ),
        # Garbage decided on the JVM (well-formed envelope).
        ("unknown type", swap(good, "ce_type", b"shop.order_refunded")),
        ("unsupported version", swap(good, "ce_schemaversion", b"7")),
        ("no key", (None, value, headers)),
        ("empty key", (b"", value, headers)),
        ("key not UTF-8 (surrogate)", (b"\xed\xa0\x80", value, headers)),
        ("key not UTF-8 (overlong)", (b"\xc0\xaf", value, headers)),
        ("tombstone", (key, None, headers)),
        ("value not UTF-8", (key, b"\xff\xfe", headers)),
        # Garbage the Python pass decides.
        ("not JSON", (key, b"not json", headers)),
        ("JSON array", (key, b"[1, 2]", headers)),
        ("empty value", (key, b"", headers)),
        ("no headers", (key, value, [])),
        ("a header twice", (key, value, [*headers, ("ce_id", headers[1][1])])),
        ("a user header twice", (key, value, [*headers, ("h", b"1"), ("h", b"2")])),
        ("a header value not UTF-8", (key, value, [*headers, ("h", b"\xff")])),
        ("a null header value", (key, value, [*headers, ("h", None)])),
        ("missing ce_source", (key, value, [h for h in headers if h[0] != "ce_source"])),
        ("ce_specversion 0.3", swap(good, "ce_specversion", b"0.3")),
        ("content-type text/plain", swap(good, "content-type", b"text/plain")),
        ("ce_id not a UUID", swap(good, "ce_id", b"123")),
        ("ce_time 30 February", swap(good, "ce_time", b"2026-02-30T10:00:00.000000Z")),
        ("ce_time year 0", swap(good, "ce_time", b"0000-01-01T00:00:00.000000Z")),
        ("ce_schemaversion 01", swap(good, "ce_schemaversion", b"01")),
        # Java's $ also matches before a final newline; Python's fullmatch does not.
        ("ce_id, then a newline", swap(good, "ce_id", headers[1][1] + b"\n")),  # type: ignore[operator]
        ("ce_time, then a newline", swap(good, "ce_time", b"2026-03-01T10:30:15.250000Z\n")),
        ("ce_schemaversion, then a newline", swap(good, "ce_schemaversion", b"1\n")),
        ("line price, then a newline", replace(good, b'"4.50"', b'"4.50\\n"')),
        ("shipped_on, then a newline", replace(shipped, b'00:00Z"', b'00:00Z\\n"')),
        ("empty ce_type", swap(good, "ce_type", b"")),
        ("negative amount", replace(good, b'"9.00"', b'"-9.00"')),
        ("three decimal places", replace(good, b'"9.00"', b'"9.001"')),
        ("quantity 0", replace(good, b'"quantity":2', b'"quantity":0')),
        ("quantity not a number", replace(good, b'"quantity":2', b'"quantity":"x"')),
        ("unknown currency", replace(good, b'"EUR"', b'"GBP"')),
        ("strict model, unknown field", replace(wire(Strict(name="n")), b'"n"', b'"n","x":1')),
        (
            "unsupported parcel version",
            swap(wire(ParcelV2(parcel_id="p", kilograms=1)), "ce_schemaversion", b"3"),
        ),
        ("envelope field in the payload", replace(good, b'"note":null', b'"note":null,"id":"x"')),
        ("order_id missing", replace(good, b'"order_id":"o-1",', b"")),
        (
            "lines null",
            replace(
                good, b'"lines":[{"sku":"s","quantity":2,"unit_price":"4.50"}]', b'"lines":null'
            ),
        ),
        ("order_id a number", replace(good, b'"order_id":"o-1"', b'"order_id":1')),
        ("nested: weight negative", replace(shipped, b'"weight":1.5', b'"weight":-1.5')),
        ("nested: no labels", replace(shipped, b'"labels":["fragile",', b'"labels":[],"x":[')),
        ("too many digits", replace(shipped, b'"123.40"', b'"1234.40"')),
        ("parcel above its bound", replace(shipped, b'"parcel":3', b'"parcel":1001')),
        ("order_id too short", replace(shipped, b'"order_id":"o-7"', b'"order_id":"o"')),
        ("shipped_on naive", replace(shipped, b'"2026-02-28T23:00:00Z"', b'"2026-02-28T23:00:00"')),
        (
            "shipped_on 31 April",
            replace(shipped, b'"2026-02-28T23:00:00Z"', b'"2026-04-31T23:00:00Z"'),
        ),
        # Every entry of an array checked at once (no lambda): each kind of bad entry.
        ("a null line", replace(good, LINE, b"null")),
        ("a null line after a good one", replace(good, LINE, LINE + b",null")),
        ("second line quantity 0", replace(good, LINE, LINE + b"," + LINE.replace(b":2", b":0"))),
        ("second line price 4.505", replace(good, LINE, LINE + b"," + LINE.replace(b"50", b"505"))),
        ("line price with a comma", replace(good, b'"4.50"', b'"4,50"')),
        ("line price 4,5 and 0", replace(good, LINE, LINE.replace(b"4.50", b"4,5") + b"," + LINE)),
        ("line price empty", replace(good, b'"4.50"', b'""')),
        ("line price null", replace(good, b'"4.50"', b"null")),
        ("line sku null", replace(good, b'"sku":"s"', b'"sku":null')),
        ("line quantity null", replace(good, b'"quantity":2', b'"quantity":null')),
        ("line price -0.00", replace(good, b'"4.50"', b'"-0.00"')),
        ("line price 0.5 (1 place)", replace(good, b'"4.50"', b'"0.5"')),
        ("no lines", replace(good, LINE, b"")),
        ("a null label", replace(shipped, b'"fragile",', b'"fragile",null,')),
        ("user header CE_X", (key, value, [*headers, ("CE_X", b"1")])),
        ("user header Content-Type", (key, value, [*headers, ("Content-Type", b"1")])),
        ("user header name with a newline", (key, value, [*headers, ("a\nce_x", b"1")])),
        ("user header value with a newline", (key, value, [*headers, ("h", b"a\nb")])),
        ("user header value cut UTF-8", (key, value, [*headers, ("h", b"\xc3"), ("g", b"A")])),
        ("user header value empty", (key, value, [*headers, ("h", b"")])),
        # Oversize for its column: valid for Pydantic, not representable in Spark.
        (
            "amount too large for decimal(38,2)",
            replace(good, b'"9.00"', b'"' + b"9" * 37 + b'.00"'),
        ),
        (
            "quantity beyond a long",
            replace(good, b'"quantity":2', b'"quantity":' + str(2**70).encode()),
        ),
        *foreign(),
    ]
    return cases


def foreign() -> list[tuple[str, Record]]:
    """Other producers' CloudEvents (the official SDK's binary and structured content modes,
    an id that is not a UUID, no schemaversion), and bad ones: decided by the registry."""
    payload = json.loads(wire(order())[1] or b"")
    sdk = CloudEvent(
        attributes={
            "type": "shop.order_placed",
            "source": "urn:go:checkout",
            "id": "checkout-17",
            "partitionkey": "o-1",
            "time": WHEN,
        },
        data=payload,
    )
    binary, structured = kafka.to_binary_event(sdk), kafka.to_structured_event(sdk)

    def record(message: kafka.KafkaMessage) -> Record:
        return b"o-1", message.value, list(message.headers.items())

    def version_9() -> Record:  # dataschema names a version the registry does not know
        return record(kafka.to_binary_event(_with(sdk, dataschema="https://x/v9")))

    structured_headers: Headers = list(structured.headers.items())
    return [
        ("foreign, SDK binary mode", record(binary)),
        ("foreign, SDK structured mode", record(structured)),
        (
            "foreign, version from dataschema",
            record(kafka.to_binary_event(_with(sdk, dataschema="https://x/order_placed/v1.json"))),
        ),
        ("foreign, structured not JSON", (b"o-1", b"{", structured_headers)),
        (
            "foreign, structured data_base64",
            (b"o-1", b'{"data_base64":"e30="}', structured_headers),
        ),
        ("foreign, id too long", record(kafka.to_binary_event(_with(sdk, id="i" * 257)))),
        ("foreign, unsupported version", version_9()),
        # No time (Go's and Java's SDKs set none by default): the record's timestamp.
        (
            "foreign, no time",
            (b"o-1", binary.value, [h for h in record(binary)[2] if h[0] != "ce_time"]),
        ),
    ]


def _with(event: CloudEvent, **attributes: Any) -> CloudEvent:
    return CloudEvent(attributes={**event.get_attributes(), **attributes}, data=event.get_data())


def python_outcomes(reg: EventRegistry, records: list[Record]) -> list[dict[str, Any]]:
    """The Python decoder's verdict per record, as rows of the decoded schema."""
    decoder = PythonDecoder(reg)
    keys, values, headers = zip(*records, strict=True)
    result = decode_rows(
        decoder,
        pa.array([True] * len(records)),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(
            [[{"key": k, "value": v} for k, v in h] for h in headers],
            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
        ),
        pa.array(["t"] * len(records)),
        pa.array([WHEN] * len(records), pa.timestamp("us", tz="UTC")),
    )
    rows: list[dict[str, Any]] = result.to_pylist()
    return rows


def reason_of(reg: EventRegistry, record: Record) -> str | None:
    key, value, headers = record
    try:
        reg.decode(topic="t", key=key, value=value, headers=headers, record_time=WHEN)  # type: ignore[arg-type]
    except EventDecodeError as exc:
        return str(exc.reason)
    return None


def test_every_record_gets_the_python_decoders_outcome(spark: Any) -> None:
    reg = registry()
    assert [m for m in reg if not jvm_decodable(m)] == [Validated]
    labelled = corpus()
    records = [record for _, record in labelled]
    rows = [
        (key, value, "t", 0, offset, WHEN, 0, headers)
        for offset, (key, value, headers) in enumerate(records)
    ]
    source = spark.createDataFrame(rows, SOURCE_SCHEMA)
    decoded = decode(source, reg).orderBy("offset").toArrow().to_pylist()
    expected = python_outcomes(reg, records)

    mismatches = []
    for (label, record), got, want in zip(labelled, decoded, expected, strict=True):
        reason = reason_of(reg, record)
        assert want["error_reason"] == reason or want["error_reason"] == "unrepresentable", label
        got_outcome = {k: got[k] for k in want if k not in {"error_message", "error_type"}}
        want_outcome = {k: v for k, v in want.items() if k not in {"error_message", "error_type"}}
        if got_outcome != want_outcome:
            mismatches.append((label, got_outcome, want_outcome))
        if want["error_reason"] is not None:
            assert got["error_message"], label
            assert got["value"] == record[1], label
    assert mismatches == []

    by = {label: row["decoded_by"] for (label, _), row in zip(labelled, decoded, strict=True)}
    jvm = {label for label, path in by.items() if path == "jvm"}
    assert {label for label in by if label.startswith("good")} - {"good, validated model"} <= jvm
    assert {
        "unknown type",
        "unsupported version",
        "no key",
        "empty key",
        "tombstone",
        "value not UTF-8",
        "key not UTF-8 (surrogate)",
    } <= jvm
    assert by["good, validated model"] == "python"
    assert by["parcel v1, upcast to v2"] == "python"
    assert by["no ce_dataschema (an older writer)"] == "jvm"
    assert by["unsupported parcel version"] == "jvm"
    messages = {
        label: row["error_message"] for (label, _), row in zip(labelled, decoded, strict=True)
    }
    assert messages["unsupported parcel version"].endswith("known versions: 1, 2")
    upcast = next(
        row
        for (label, _), row in zip(labelled, decoded, strict=True)
        if label == "parcel v1, upcast to v2"
    )
    assert (upcast["event_version"], upcast["test_parcel_v2"]["kilograms"]) == (2, Decimal("1.5"))
    assert upcast["test_parcel_v1"] is None
    outcomes = [row["error_reason"] for row in expected]
    assert outcomes.count(None) >= 15, "the corpus must hold many valid records"
    read = ("foreign, SDK binary mode", "foreign, SDK structured mode", "foreign, no time")
    foreign_rows = [row for (label, _), row in zip(labelled, decoded, strict=True) if label in read]
    assert [(row["error_reason"], row["occurred_at"]) for row in foreign_rows] == [(None, WHEN)] * 3
    assert "unrepresentable" in outcomes


def test_a_strict_registry_refuses_foreign_events_in_both_passes(spark: Any) -> None:
    """``strict_envelope=True``: the pipeline quarantines every foreign record, with the reason
    the inbox's decoder gives (the same registry decides both)."""
    strict = EventRegistry(strict_envelope=True)
    for model in shop:
        strict.register(model)
    labelled = [(label, record) for label, record in foreign() if "SDK" in label]
    rows = [
        (key, value, "t", 0, offset, WHEN, 0, headers)
        for offset, (_, (key, value, headers)) in enumerate(labelled)
    ]
    decoded = decode(spark.createDataFrame(rows, SOURCE_SCHEMA), strict).orderBy("offset")
    got = [row["error_reason"] for row in decoded.toArrow().to_pylist()]
    assert got == [reason_of(strict, record) for _, record in labelled]
    assert got == ["missing_header", "invalid_header"]
    lenient = [reason_of(registry(), record) for _, record in labelled]
    assert lenient == [None, None]


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_writers_traceparent_stays_available_on_a_decoded_row(spark: Any) -> None:
    """Trace propagation (docs/tracing.md): the pipeline keeps the record's traceparent in the
    event's headers column, so a job can attach its work to the writer's trace."""
    key, value, headers = wire(order())
    record = (key, value, "t", 0, 0, WHEN, 0, [*headers, ("traceparent", TRACEPARENT.encode())])
    (row,) = decode(spark.createDataFrame([record], SOURCE_SCHEMA), shop).toArrow().to_pylist()
    assert row["error_reason"] is None
    assert row["decoded_by"] == "jvm"
    assert dict(row["shop_order_placed_v1"]["headers"])["traceparent"] == TRACEPARENT
