"""The CloudEvents Kafka binding: exact layout, exact round trips, and a total decoder."""

import dataclasses
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Any
from uuid import UUID

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, field_validator

from outboxkit.schemas import (
    DecodeErrorReason,
    EncodedEvent,
    Event,
    EventDecodeError,
    EventRegistry,
    SchemaError,
    WireHeader,
    encode,
)
from outboxkit.schemas.wire import format_time, parse_time


class Color(StrEnum):
    RED = "red"
    GREEN = "green"


class Priority(IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    street: str
    number: int | None = None


class Everything(Event, type="test.everything", version=3, topic="everything", key_field="name"):
    name: str
    count: int
    price: Decimal
    ratio: float
    due: datetime
    note: str | None = None
    color: Color
    priority: Priority
    address: Address
    tags: list[str]
    history: list[Address]


class Bare(Event):
    """No default topic, no key field: both come from the instance."""


class OrderPlaced(Event, type="orders.order_placed", topic="orders", key_field="order_id"):
    order_id: str
    amount: Decimal


REGISTRY, STRICT = EventRegistry(), EventRegistry(strict_envelope=True)
for _model in (Everything, Bare, OrderPlaced):
    REGISTRY.register(_model)
    STRICT.register(_model)

FIXED_ID = UUID("0b5a3d4e-8f1c-4e9a-9d2b-6c7f1a2b3c4d")
FIXED_TIME = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def decode(record: EncodedEvent, registry: EventRegistry = REGISTRY) -> Event:
    return registry.decode(
        topic=record.topic, key=record.key, value=record.value, headers=record.headers
    )


def order() -> OrderPlaced:
    return OrderPlaced(
        id=FIXED_ID,
        order_id="o-1",
        amount=Decimal("9.90"),
        occurred_at=FIXED_TIME,
        headers={"traceparent": "00-abc-01"},
    )


# --- layout --------------------------------------------------------------------------------------


def test_binary_mode_layout() -> None:
    record = encode(order(), source="/shop/orders")
    assert record == EncodedEvent(
        topic="orders",
        key=b"o-1",
        value=b'{"order_id":"o-1","amount":"9.90"}',
        headers=(
            ("ce_specversion", b"1.0"),
            ("ce_id", b"0b5a3d4e-8f1c-4e9a-9d2b-6c7f1a2b3c4d"),
            ("ce_source", b"/shop/orders"),
            ("ce_type", b"orders.order_placed"),
            ("ce_time", b"2024-05-01T12:00:00.123456Z"),
            ("ce_schemaversion", b"1"),
            ("content-type", b"application/json"),
            ("ce_dataschema", b"urn:outboxkit:schema:orders.order_placed:1"),
            ("traceparent", b"00-abc-01"),
        ),
    )
    assert all(type(name) is str for name, _ in record.headers)


def test_header_names_enum() -> None:
    assert [str(name) for name in WireHeader] == [
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
        "ce_schemaversion",
        "content-type",
    ]


def test_value_is_compact_utf8_json() -> None:
    event = OrderPlaced(order_id="bestellung-ü", amount=Decimal(1))
    assert encode(event, source="s").value == '{"order_id":"bestellung-ü","amount":"1"}'.encode()


@pytest.mark.parametrize("source", ["", None])
def test_source_is_required(source: str) -> None:
    with pytest.raises(SchemaError, match="source"):
        encode(order(), source=source)


def test_decode_record_takes_the_topic_from_the_record() -> None:
    @dataclass
    class ConsumerRecord:
        topic: str
        key: bytes | None
        value: bytes | None
        headers: Sequence[tuple[str, bytes]]

    record = encode(order(), source="s")
    mirrored = ConsumerRecord("orders.mirror", record.key, record.value, list(record.headers))
    decoded = REGISTRY.decode_record(mirrored)
    assert decoded.topic == "orders.mirror"
    assert decoded == order().model_copy(update={"topic": "orders.mirror"})


def test_round_trip_through_an_aiokafka_record_batch() -> None:
    record = encode(order(), source="/shop/orders")
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(
        0, timestamp=None, key=record.key, value=record.value, headers=list(record.headers)
    )
    builder.append(1, timestamp=None, key=record.key, value=record.value, headers=[("h", None)])
    consumed, null_header = DefaultRecordBatch(bytes(builder.build()))
    assert decode(consumed_as(record.topic, consumed)) == order()
    with pytest.raises(EventDecodeError, match="header 'h' has no bytes value"):
        decode(consumed_as(record.topic, null_header))


def consumed_as(topic: str, record: Any) -> EncodedEvent:
    return EncodedEvent(topic, record.key, record.value, tuple(record.headers))


# --- time format ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00Z", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01t12:00:00.5z", datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)),
        ("2024-05-01T14:00:00+02:00", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T11:30:00-00:30", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T12:00:00.123456789Z", datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "2024-05-01T12:00:00",
        "2024-05-01 12:00:00Z",
        "2024-13-01T12:00:00Z",
        "2024-05-01T12:00:60Z",
        "2024-05-01T12:00:00+24:00",
        "2024-05-01T12:00:00+02:60",
        "2024-05-01",
        "1714564800",
        "\uff12\uff10\uff12\uff14-05-01T12:00:00Z"  # full-width digits,
        "0001-01-01T00:00:00+01:00",
        "",
    ],
)
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"RFC 3339|range|day|month|second"):
        parse_time(text)


def test_format_time_keeps_microseconds_in_utc() -> None:
    moment = datetime(2024, 5, 1, 14, 0, 0, 7, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(moment) == "2024-05-01T12:00:00.000007Z"


# --- decode errors -------------------------------------------------------------------------------


def replace_header(record: EncodedEvent, name: str, value: bytes | None) -> EncodedEvent:
    headers = [(n, v) for n, v in record.headers if n != name]
    if value is not None:
        headers.append((name, value))
    return EncodedEvent(record.topic, record.key, record.value, tuple(headers))


def decode_error(record: EncodedEvent, registry: EventRegistry = STRICT) -> EventDecodeError:
    with pytest.raises(EventDecodeError) as caught:
        decode(record, registry)
    return caught.value


@pytest.mark.parametrize("name", [str(header) for header in WireHeader])
def test_each_protocol_header_is_required(name: str) -> None:
    error = decode_error(replace_header(encode(order(), source="s"), name, None))
    assert error.reason is DecodeErrorReason.MISSING_HEADER
    assert f"missing header(s): {name}" in str(error)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ce_specversion", b"0.3", "ce_specversion is '0.3', expected '1.0'"),
        ("content-type", b"application/avro", "content-type is 'application/avro'"),
        ("ce_id", b"not-a-uuid", "ce_id 'not-a-uuid' is not a UUID"),
        ("ce_time", b"yesterday", "ce_time 'yesterday': not an RFC 3339 timestamp"),
        ("ce_schemaversion", b"0", "ce_schemaversion '0' is not an integer >= 1"),
        ("ce_schemaversion", b"v1", "ce_schemaversion 'v1' is not an integer >= 1"),
        ("ce_type", b"", "ce_type is empty"),
        ("ce_source", b"", "ce_source is empty"),
        ("ce_id", b"\xff\xfe", "header 'ce_id' is not valid UTF-8"),
        ("traceparent", b"\xc3", "header 'traceparent' is not valid UTF-8"),
    ],
)
def test_invalid_headers(name: str, value: bytes, message: str) -> None:
    error = decode_error(replace_header(encode(order(), source="s"), name, value))
    assert error.reason is DecodeErrorReason.INVALID_HEADER
    assert message in str(error)


@pytest.mark.parametrize("name", ["ce_type", "traceparent"])
def test_repeated_headers_are_invalid(name: str) -> None:
    record = encode(order(), source="s")
    value = dict(record.headers)[name]
    repeated = (*record.headers, (name, value))
    error = decode_error(EncodedEvent(record.topic, record.key, record.value, repeated))
    assert error.reason is DecodeErrorReason.INVALID_HEADER
    assert f"header {name!r} is repeated" in str(error)


def test_header_without_a_value_is_invalid() -> None:
    record = encode(order(), source="s")
    headers = (*record.headers, ("tombstoned", None))
    with pytest.raises(EventDecodeError) as caught:
        REGISTRY.decode(topic="orders", key=record.key, value=record.value, headers=headers)  # type: ignore[arg-type]
    assert caught.value.reason is DecodeErrorReason.INVALID_HEADER


def test_unknown_extension_headers_of_other_producers_are_ignored() -> None:
    record = encode(order(), source="s")
    extended = EncodedEvent(
        record.topic, record.key, record.value, (*record.headers, ("ce_traceparent", b"x"))
    )
    assert decode(extended) == order()


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "the record has no key"),
        (b"", "the record key is empty"),
        (b"\x80", "the record key is not valid UTF-8"),
    ],
)
def test_invalid_keys(key: bytes | None, message: str) -> None:
    record = encode(order(), source="s")
    with pytest.raises(EventDecodeError, match=message) as caught:
        REGISTRY.decode(topic=record.topic, key=key, value=record.value, headers=record.headers)
    assert caught.value.reason is DecodeErrorReason.INVALID_KEY


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "the record has no value"),
        (b"\xff\x00garbage", "not valid UTF-8"),
        (b"garbage", "not JSON"),
        (b'{"order_id": "o-1",', "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b'["o-1", "9.90"]', "a JSON list, not an object"),
        (b"null", "a JSON NoneType, not an object"),
        ('{"order_id":"o-1","amount":"1"}'.encode("utf-16"), "not valid UTF-8"),
    ],
)
def test_garbage_values(value: bytes | None, message: str) -> None:
    record = encode(order(), source="s")
    with pytest.raises(EventDecodeError, match=message) as caught:
        REGISTRY.decode(topic=record.topic, key=record.key, value=value, headers=record.headers)
    assert caught.value.reason is DecodeErrorReason.INVALID_VALUE


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b'{"order_id":"o-1"}', "orders.order_placed v1: amount: Field required"),
        (b'{"order_id":"o-1","amount":"lots"}', "amount: Input should be a valid decimal"),
        (b'{"order_id":"o-1","amount":"1","id":"x"}', "must hold payload fields only, found id"),
    ],
)
def test_invalid_payloads_name_the_field(value: bytes, message: str) -> None:
    record = encode(order(), source="s")
    with pytest.raises(EventDecodeError, match=message) as caught:
        REGISTRY.decode(topic=record.topic, key=record.key, value=value, headers=record.headers)
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD


def test_payload_errors_do_not_echo_the_input() -> None:
    record = encode(order(), source="s")
    value = b'{"order_id":"o-1","amount":"secret-iban-DE00"}'
    with pytest.raises(EventDecodeError) as caught:
        REGISTRY.decode(topic=record.topic, key=record.key, value=value, headers=record.headers)
    assert "secret" not in str(caught.value)


def test_invalid_topic_is_reported_as_invalid_payload() -> None:
    record = encode(order(), source="s")
    with pytest.raises(EventDecodeError, match="topic") as caught:
        REGISTRY.decode(topic="", key=record.key, value=record.value, headers=record.headers)
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD


def test_exceptions_from_a_models_own_validator_are_wrapped() -> None:
    class Touchy(Event, type="test.touchy", topic="t"):
        n: int

        @field_validator("n")
        @classmethod
        def _explode(cls, value: int) -> int:
            if value == 13:
                raise KeyError("unlucky")
            return value

    registry = EventRegistry()
    registry.register(Touchy)
    good = encode(Touchy(n=1, key="k", id=FIXED_ID, occurred_at=FIXED_TIME), source="s")
    record = dataclasses.replace(good, value=good.value.replace(b'"n":1', b'"n":13'))
    with pytest.raises(EventDecodeError, match="validation raised KeyError") as caught:
        decode(record, registry)
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD


def test_decode_error_survives_pickling() -> None:
    error = EventDecodeError(DecodeErrorReason.UNKNOWN_TYPE, "event type 'x' is not registered")
    copy = pickle.loads(pickle.dumps(error))
    assert copy.reason is DecodeErrorReason.UNKNOWN_TYPE
    assert str(copy) == str(error)


# --- property: every valid event survives the round trip -----------------------------------------

offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
aware = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.timezones() | offsets | st.just(UTC),
)
# A naive payload datetime stays naive; an aware one keeps its instant (compared as instants).
payload_datetimes = st.datetimes(timezones=st.none() | offsets | st.just(UTC))
topics = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True).filter(
    lambda topic: topic not in {".", ".."}
)
user_header_names = st.text(max_size=20).filter(
    lambda name: not name.lower().startswith("ce_") and name.lower() != "content-type"
)
#: URI-references (RFC 3986): URNs, relative paths, percent-encoded text.
sources = st.from_regex(
    r"(?a)[a-z]{1,9}:[\w.~:@/-]{1,30}|/?[\w.~-]{1,20}(/[\w.~@:-]{0,9}){0,3}", fullmatch=True
)
envelopes = st.fixed_dictionaries(
    {
        "id": st.uuids(),
        "occurred_at": aware,
        "headers": st.dictionaries(user_header_names, st.text(max_size=30), max_size=4),
    },
    optional={"topic": topics, "key": st.text(min_size=1, max_size=30)},
)
addresses = st.builds(Address, street=st.text(), number=st.none() | st.integers())
everything_payloads = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1),
        "count": st.integers(),
        "price": st.decimals(allow_nan=False, allow_infinity=False),
        "ratio": st.floats(allow_nan=False, allow_infinity=False),
        "due": payload_datetimes,
        "color": st.sampled_from(Color),
        "priority": st.sampled_from(Priority),
        "address": addresses,
        "tags": st.lists(st.text(), max_size=5),
        "history": st.lists(addresses, max_size=3),
    },
    optional={"note": st.none() | st.text()},
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    envelope = draw(envelopes)
    kind = draw(st.sampled_from(["everything", "bare", "order"]))
    if kind == "everything":
        return Everything.model_validate({**draw(everything_payloads), **envelope})
    if kind == "bare":
        envelope.setdefault("topic", draw(topics))
        envelope.setdefault("key", draw(st.text(min_size=1, max_size=30)))
        return Bare.model_validate(envelope)
    return OrderPlaced.model_validate(
        {
            **envelope,
            "order_id": draw(st.text(min_size=1)),
            "amount": draw(st.decimals(allow_nan=False, allow_infinity=False)),
        }
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events(), sources)
def test_every_valid_event_round_trips_exactly(event: Event, source: str) -> None:
    record = encode(event, source=source)
    decoded = decode(record)
    assert type(decoded) is type(event)
    assert decoded == event
    assert decoded.occurred_at == event.occurred_at
    assert decoded.occurred_at.tzinfo is UTC
    assert encode(decoded, source=source) == record


# --- property: the decoder is total --------------------------------------------------------------


def decodes_or_fails_cleanly(
    topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> None:
    """Decoding gives an event or EventDecodeError; any other exception fails the test."""
    try:
        event = REGISTRY.decode(topic=topic, key=key, value=value, headers=headers)
    except EventDecodeError as error:
        caught = error
    else:
        assert isinstance(event, Event)
        assert decode(encode(event, source="again")) == event
        return
    assert isinstance(caught.reason, DecodeErrorReason)


@settings(max_examples=150, deadline=None)
@given(
    topic=st.text(max_size=20),
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=100),
    headers=st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=10),
)
def test_decoder_survives_arbitrary_bytes(
    topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> None:
    decodes_or_fails_cleanly(topic, key, value, headers)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
FIELD_NAMES = sorted({*Everything.model_fields, *OrderPlaced.model_fields, "street", "number", "x"})
json_objects = st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=8)

# Per header: values that pass (so that decoding gets past the headers) and near misses.
GOOD_HEADER_VALUES: dict[str, list[bytes]] = {
    "ce_specversion": [b"1.0"],
    "ce_id": [str(FIXED_ID).encode(), FIXED_ID.hex.encode()],
    "ce_source": [b"s"],
    "ce_type": [b"test.everything", b"orders.order_placed", b"Bare", b"unknown.type"],
    "ce_time": [b"2024-05-01T12:00:00Z", b"0001-01-01T00:00:00-00:01"],
    "ce_schemaversion": [b"1", b"3", b"2"],
    "content-type": [b"application/json", b"Application/JSON; charset=utf-8"],
}
BAD_HEADER_VALUES = [b"", b"1.0 ", b"0.3", b"urn:uuid:x", b"2024-02-30T00:00:00Z", b"01", b"\xff"]


@st.composite
def plausible_headers(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """Mostly-valid CloudEvents headers: at most two are broken or left out."""
    names = list(GOOD_HEADER_VALUES)
    broken = draw(st.sets(st.sampled_from(names), max_size=2))
    headers: list[tuple[str, bytes]] = []
    for name in names:
        if name not in broken:
            headers.append((name, draw(st.sampled_from(GOOD_HEADER_VALUES[name]))))
        elif draw(st.booleans()):  # broken: a wrong value, or no header at all
            bad = st.sampled_from(BAD_HEADER_VALUES) | st.binary(max_size=20)
            headers.append((name, draw(bad)))
    extra_names = st.sampled_from(["trace", "ce_other", "CE_ID", "ce_id"])
    headers.extend(draw(st.lists(st.tuples(extra_names, st.binary(max_size=8)), max_size=2)))
    return draw(st.permutations(headers))


@settings(max_examples=120, deadline=None)
@given(
    topic=topics,
    key=st.just(b"k") | st.none() | st.binary(max_size=10),
    value=st.sampled_from([b"{}", b'{"order_id":"o-1","amount":"1.5"}'])
    | json_objects.map(lambda o: json.dumps(o).encode())
    | st.none()
    | st.binary(max_size=50),
    headers=plausible_headers(),
)
def test_decoder_survives_plausible_headers_and_json(
    topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> None:
    decodes_or_fails_cleanly(topic, key, value, headers)


@st.composite
def mutated_records(
    draw: st.DrawFn,
) -> tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]:
    record = encode(draw(events()), source="s")
    key: bytes | None = record.key
    value: bytes | None = record.value
    topic, headers = record.topic, list(record.headers)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        mutation = draw(
            st.sampled_from(
                ["drop", "duplicate", "corrupt", "truncate", "replace_value", "flip", "key"]
            )
        )
        if mutation == "drop" and headers:
            headers.pop(draw(st.integers(0, len(headers) - 1)))
        elif mutation == "duplicate" and headers:
            headers.append(headers[draw(st.integers(0, len(headers) - 1))])
        elif mutation == "corrupt" and headers:
            index = draw(st.integers(0, len(headers) - 1))
            headers[index] = (headers[index][0], draw(st.binary(max_size=30)))
        elif mutation == "truncate" and value:
            value = value[: draw(st.integers(0, len(value) - 1))]
        elif mutation == "replace_value":
            value = json.dumps(draw(json_objects)).encode()
        elif mutation == "flip" and value:
            index = draw(st.integers(0, len(value) - 1))
            value = (
                value[:index]
                + bytes([value[index] ^ draw(st.integers(1, 255))])
                + value[index + 1 :]
            )
        elif mutation == "key":
            key = draw(st.none() | st.binary(max_size=10))
    return topic, key, value, headers


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_records())
def test_decoder_survives_mutated_encodings(
    record: tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]],
) -> None:
    decodes_or_fails_cleanly(*record)
