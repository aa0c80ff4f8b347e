"""Other producers' CloudEvents, written by the official CloudEvents SDK for Python (what a Go,
Java or TypeScript service's SDK writes alike): binary and structured content mode, an id that
is not a UUID, no ``schemaversion``. The registry reads them as the same event in both modes,
refuses them all with ``strict_envelope=True``, and refuses bad ones with a reason (never
another exception); the SDK reads outboxkit's own records."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import structlog.testing
from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from outboxkit.schemas import (
    DecodeErrorReason,
    Event,
    EventDecodeError,
    EventRegistry,
    ForeignForm,
    encode,
)
from outboxkit.schemas.foreign import MAX_ID_LENGTH, foreign_event_id


class Paid(Event, type="shop.paid", topic="shop.paid", key_field="order_id"):
    order_id: str
    amount: Decimal


class PaidV2(Event, type="shop.paid", version=2, topic="shop.paid", key_field="order_id"):
    order_id: str
    amount: Decimal
    currency: str


def _registry(*, strict: bool = False) -> EventRegistry:
    registry = EventRegistry(strict_envelope=strict)
    registry.register(Paid)
    registry.register(PaidV2)
    return registry


def _sdk_event(**attributes: Any) -> CloudEvent:
    data = attributes.pop("data", {"order_id": "o-1", "amount": "9.90"})
    return CloudEvent(
        attributes={
            "type": "shop.paid",
            "source": "urn:java:billing",
            "id": "pay-42",
            "partitionkey": "o-1",
            **attributes,
        },
        data=data,
    )


MODES = {"binary": kafka.to_binary_event, "structured": kafka.to_structured_event}


def _decode(registry: EventRegistry, message: kafka.KafkaMessage) -> Event:
    key = message.key.encode() if isinstance(message.key, str) else message.key
    return registry.decode(
        topic="shop.paid", key=key, value=message.value, headers=list(message.headers.items())
    )


def _refusal(registry: EventRegistry, message: kafka.KafkaMessage) -> EventDecodeError:
    with pytest.raises(EventDecodeError) as caught:
        _decode(registry, message)
    return caught.value


@pytest.mark.parametrize("mode", list(MODES))
def test_an_sdk_event_is_read_in_both_modes_as_the_same_event(mode: str) -> None:
    event = _sdk_event()
    read = _decode(_registry(), MODES[mode](event))
    assert isinstance(read, Paid)
    assert (read.order_id, read.amount, read.key) == ("o-1", Decimal("9.90"), "o-1")
    # Not a UUID: the idempotency key is derived from source and id, in every reader alike.
    assert str(read.id) == foreign_event_id("urn:java:billing", "pay-42")
    assert read.occurred_at == event.get_time()
    strict = _refusal(_registry(strict=True), MODES[mode](event))
    assert strict.reason in {DecodeErrorReason.MISSING_HEADER, DecodeErrorReason.INVALID_HEADER}


@pytest.mark.parametrize(
    ("attributes", "assumed", "version"),
    [
        ({}, None, 1),  # no version anywhere: 1
        ({}, 2, 2),  # no version anywhere: the type's default
        ({"dataschema": "https://schemas.example.com/shop.paid/v2.json"}, None, 2),
        ({"dataschema": "urn:outboxkit:schema:PaidV2:2"}, 1, 2),  # dataschema before default
        ({"schemaversion": "2", "dataschema": "https://x/v1"}, None, 2),  # the extension first
    ],
)
def test_a_missing_schemaversion_comes_from_dataschema_or_the_types_default(
    attributes: dict[str, str], assumed: int | None, version: int
) -> None:
    registry = _registry()
    if assumed is not None:
        registry.assume_version("shop.paid", assumed)
    data = {"order_id": "o-1", "amount": "9.90", "currency": "EUR"}
    for mode in MODES.values():
        read = _decode(registry, mode(_sdk_event(data=data, **attributes)))
        assert read.event_version == version


def test_an_assumed_version_is_logged_once_per_type_and_version() -> None:
    registry = _registry()
    with structlog.testing.capture_logs() as logs:
        for mode in [*MODES.values(), *MODES.values()]:
            _decode(registry, mode(_sdk_event()))
        _decode(registry, kafka.to_binary_event(_sdk_event(schemaversion="1")))
    assumed = [log for log in logs if "without ce_schemaversion" in log["event"]]
    assert [(log["event_type"], log["event_version"]) for log in assumed] == [("shop.paid", 1)]


def _timeless(message: kafka.KafkaMessage) -> kafka.KafkaMessage:
    """The message without its event's time (an SDK that does not set one: Go's, Java's)."""
    if "ce_time" in message.headers:
        headers = {k: v for k, v in message.headers.items() if k != "ce_time"}
        return kafka.KafkaMessage(headers=headers, key=message.key, value=message.value)
    document = json.loads(message.value)
    del document["time"]
    return dataclasses.replace(message, value=json.dumps(document).encode())


@dataclasses.dataclass
class _Consumed:
    """What the inbox's consumer gives: aiokafka's ConsumerRecord, its timestamp in ms."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int


@pytest.mark.parametrize("mode", list(MODES))
def test_an_event_without_time_takes_the_records_timestamp(mode: str) -> None:
    message = _timeless(MODES[mode](_sdk_event()))
    error = _refusal(_registry(), message)
    assert (error.reason, "ce_time" in str(error)) == (DecodeErrorReason.MISSING_HEADER, True)
    at = datetime(2026, 3, 1, 10, 30, 15, 250000, tzinfo=UTC)
    headers = list(message.headers.items())
    consumed = _Consumed("shop.paid", b"o-1", message.value, headers, int(at.timestamp() * 1000))
    assert _registry().decode_record(consumed).occurred_at == at
    with pytest.raises(EventDecodeError):
        _registry(strict=True).decode_record(consumed)


@pytest.mark.parametrize(
    ("structured", "uuid_id", "versioned", "content_type", "timed"),
    list(itertools.product([False, True], repeat=5)),
)
def test_every_way_a_record_differs_from_outboxkits_form_is_reported(
    structured: bool, uuid_id: bool, versioned: bool, content_type: bool, timed: bool
) -> None:
    """Each of the 32 combinations of the five forms: exactly those the record has, in
    ``ForeignForm``'s order (the inbox counts each); none for outboxkit's own form."""
    attributes: dict[str, Any] = {}
    if uuid_id:
        attributes["id"] = str(uuid.uuid4())
    if versioned:
        attributes["schemaversion"] = "1"
    if content_type:
        attributes["datacontenttype"] = "application/json"
    message = (kafka.to_structured_event if structured else kafka.to_binary_event)(
        _sdk_event(**attributes)
    )
    if not timed:
        message = _timeless(message)
    consumed = _Consumed("shop.paid", b"o-1", message.value, list(message.headers.items()), 0)
    forms: list[ForeignForm] = []
    _registry().decode_record(consumed, foreign_forms=forms)
    differs = {
        ForeignForm.STRUCTURED: structured,
        ForeignForm.DERIVED_ID: not uuid_id,
        ForeignForm.ASSUMED_VERSION: not versioned,
        ForeignForm.IMPLIED_CONTENT_TYPE: not structured and not content_type,
        ForeignForm.RECORD_TIME: not timed,
    }
    assert forms == [form for form in ForeignForm if differs[form]]


def test_outboxkits_own_records_are_in_no_foreign_form() -> None:
    written = encode(Paid(order_id="o-1", amount=Decimal("9.90")), source="urn:python:shop")
    forms: list[ForeignForm] = []
    _registry().decode(
        topic=written.topic,
        key=written.key,
        value=written.value,
        headers=written.headers,
        foreign_forms=forms,
    )
    assert forms == []


def test_a_uuid_id_stays_the_event_id() -> None:
    event_id = "0b5a3d4e-8f1c-4e9a-9d2b-6c7f1a2b3c4d"
    read = _decode(_registry(), kafka.to_structured_event(_sdk_event(id=event_id)))
    assert str(read.id) == event_id


def _structured(value: bytes) -> kafka.KafkaMessage:
    return kafka.KafkaMessage(
        headers={"content-type": b"application/cloudevents+json"}, key=b"o-1", value=value
    )


@pytest.mark.parametrize(
    ("message", "reason", "says"),
    [
        (
            kafka.to_binary_event(_sdk_event(id="x" * (MAX_ID_LENGTH + 1))),
            DecodeErrorReason.INVALID_HEADER,
            f"over the {MAX_ID_LENGTH}",
        ),
        (_structured(b"not json"), DecodeErrorReason.INVALID_VALUE, "is not JSON"),
        (_structured(b"[1]"), DecodeErrorReason.INVALID_VALUE, "a JSON list, not an object"),
        (_structured(b'{"data":{"n":NaN}}'), DecodeErrorReason.INVALID_VALUE, "NaN is not"),
        (
            _structured(b'{"specversion":"1.0","data_base64":"e30="}'),
            DecodeErrorReason.INVALID_VALUE,
            "data_base64",
        ),
        (
            kafka.to_structured_event(_sdk_event(data="text")),
            DecodeErrorReason.INVALID_VALUE,
            "data is a JSON str",
        ),
        (
            kafka.to_structured_event(_sdk_event(datacontenttype="application/xml")),
            DecodeErrorReason.INVALID_HEADER,
            "datacontenttype",
        ),
        (
            _structured(b'{"specversion":"1.0","id":7,"data":{}}'),
            DecodeErrorReason.INVALID_HEADER,
            "id is a JSON int",
        ),
        (
            _structured(b'{"specversion":"1.0","id":"1","type":"shop.paid","data":{}}'),
            DecodeErrorReason.MISSING_HEADER,
            "ce_source, ce_time",
        ),
        (
            kafka.to_binary_event(_sdk_event(data={"order_id": "o-1", "amount": "nine"})),
            DecodeErrorReason.INVALID_PAYLOAD,
            "amount",
        ),
    ],
)
def test_bad_foreign_events_are_refused_with_a_reason(
    message: kafka.KafkaMessage, reason: DecodeErrorReason, says: str
) -> None:
    error = _refusal(_registry(), message)
    assert error.reason is reason
    assert says in str(error)


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["specversion", "id", "source", "type", "time", "data", "x"]),
                inner,
                max_size=6,
            )
        ),
        max_leaves=12,
    )
)
def test_any_structured_value_is_read_or_refused_with_a_reason(document: Any) -> None:
    with contextlib.suppress(EventDecodeError):  # any other exception fails the test
        _decode(_registry(), _structured(json.dumps(document).encode()))


_ATTRIBUTES = {
    "specversion": "1.0",
    "type": "shop.paid",
    "source": "urn:java:billing",
    "id": "pay-42",
    "time": "2026-12-07T10:00:00Z",
    "partitionkey": "o-1",
}


def _outcome(registry: EventRegistry, message: kafka.KafkaMessage) -> object:
    try:
        return _decode(registry, message).model_dump()
    except EventDecodeError as error:
        return error.reason


@settings(max_examples=150, deadline=None)
@given(
    st.decimals(allow_nan=False, allow_infinity=False).map(str)
    | st.floats(allow_nan=False, allow_infinity=False).map(repr)
    | st.integers().map(str)
    | st.sampled_from(["1e400", "-1E+400", "12345678901234567.89", "0.1000000000000000000001"])
)
def test_a_number_in_structured_data_reads_as_in_binary_mode(number: str) -> None:
    """Structured mode's ``data`` reads as the same JSON text sent in binary mode: every digit
    of a number kept (through a float, 12345678901234567.89 read as 12345678901234568 and
    1e400 as infinite), or the same refusal."""
    data = f'{{"order_id":"o-1","amount":{number}}}'
    binary = kafka.to_binary_event(_sdk_event(time=datetime(2026, 12, 7, 10, tzinfo=UTC)))
    binary = dataclasses.replace(binary, value=data.encode())
    document = json.dumps({**_ATTRIBUTES, "data": "<data>"}).replace('"<data>"', data)
    structured = _structured(document.encode())
    registry = _registry()
    assert _outcome(registry, structured) == _outcome(registry, binary)


def test_the_sdk_reads_outboxkits_records() -> None:
    paid = Paid(order_id="o-1", amount=Decimal("9.90"))
    record = encode(paid, source="urn:service:shop")
    message = kafka.KafkaMessage(headers=dict(record.headers), key=record.key, value=record.value)
    read = kafka.from_binary_event(message)
    assert (read.get_id(), read.get_type(), read.get_source()) == (
        str(paid.id),
        "shop.paid",
        "urn:service:shop",
    )
    assert read.get_extension("schemaversion") == "1"
    assert read.get_data() == {"order_id": "o-1", "amount": "9.90"}
    assert read.get_time() == paid.occurred_at
