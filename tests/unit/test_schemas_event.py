"""The Event base model: class keywords, envelope defaults and validation."""

import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest
from pydantic import ValidationError

from outboxkit.core.exceptions import OutboxkitError
from outboxkit.schemas import Event, EventDefinitionError, SchemaError


class OrderPlaced(
    Event, type="orders.order_placed", version=2, topic="orders", key_field="customer_id"
):
    order_id: str
    customer_id: str
    amount: Decimal


class Plain(Event):
    note: str


class Counted(Event, topic="counters", key_field="counter"):
    counter: int
    label: str | None = None


class Reading(Event, topic="readings", key_field="sensor"):
    sensor: UUID


def order(**overrides: object) -> OrderPlaced:
    fields: dict[str, object] = {"order_id": "o-1", "customer_id": "c-7", "amount": "9.90"}
    fields.update(overrides)
    return OrderPlaced.model_validate(fields)


# --- class keywords ----------------------------------------------------------------------------


def test_class_keywords_are_readable_from_class_and_instance() -> None:
    assert OrderPlaced.event_type == "orders.order_placed"
    assert OrderPlaced.event_version == 2
    assert OrderPlaced.event_topic == "orders"
    assert OrderPlaced.event_key_field == "customer_id"
    event = order()
    assert (event.event_type, event.event_version) == ("orders.order_placed", 2)


def test_metadata_defaults() -> None:
    assert Plain.event_type == "Plain"
    assert Plain.event_version == 1
    assert Plain.event_topic is None
    assert Plain.event_key_field is None


def test_metadata_is_not_a_field() -> None:
    assert set(OrderPlaced.model_fields) == {
        "id",
        "key",
        "topic",
        "occurred_at",
        "headers",
        "order_id",
        "customer_id",
        "amount",
    }
    assert OrderPlaced.event_payload_fields == ("order_id", "customer_id", "amount")


def test_subclass_inherits_topic_and_key_field_but_not_type_or_version() -> None:
    class OrderPlacedAgain(OrderPlaced):
        coupon: str | None = None

    assert OrderPlacedAgain.event_type == "OrderPlacedAgain"
    assert OrderPlacedAgain.event_version == 1
    assert OrderPlacedAgain.event_topic == "orders"
    assert OrderPlacedAgain.event_key_field == "customer_id"
    assert OrderPlacedAgain.event_payload_fields[-1] == "coupon"


def test_pydantic_config_keywords_still_work() -> None:
    class Stripped(Event, str_strip_whitespace=True, topic="t"):
        name: str

    assert Stripped(name="  x  ", key="k").name == "x"


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"version": 0}, "version must be >= 1"),
        ({"version": "2"}, "version must be an int"),
        ({"version": True}, "version must be an int"),
        ({"type": ""}, "type must be a non-empty string"),
        ({"type": "   "}, "type must be a non-empty string"),
        ({"topic": "no spaces"}, "not a valid topic name"),
        ({"topic": ".."}, "not a valid topic name"),
        ({"key_field": "missing"}, "key_field 'missing' is not a payload field"),
        ({"key_field": "id"}, "key_field 'id' is not a payload field"),
        ({"verison": 2}, "unknown class keyword(s) 'verison'"),
    ],
)
def test_bad_class_keywords_fail_at_class_creation(
    keywords: dict[str, object], message: str
) -> None:
    with pytest.raises(EventDefinitionError, match=re.escape(message)):
        type("Broken", (Event,), {"__annotations__": {"name": str}}, **keywords)


@pytest.mark.parametrize("name", ["id", "key", "topic", "occurred_at", "headers", "event_type"])
def test_envelope_and_metadata_names_cannot_be_redeclared(name: str) -> None:
    with pytest.raises(EventDefinitionError, match=f"'{name}' is a reserved name"):
        type("Broken", (Event,), {"__annotations__": {name: str}})


def test_definition_error_is_in_the_tree() -> None:
    assert issubclass(EventDefinitionError, SchemaError)
    assert issubclass(SchemaError, OutboxkitError)


# --- topic ---------------------------------------------------------------------------------------


def test_topic_defaults_to_the_class_topic() -> None:
    assert order().topic == "orders"
    assert "topic" in order().model_fields_set


def test_explicit_topic_wins() -> None:
    assert order(topic="orders.eu").topic == "orders.eu"


def test_missing_topic_is_a_clear_validation_error() -> None:
    with pytest.raises(ValidationError, match="Plain has no default topic: pass topic="):
        Plain(note="n", key="k")


@pytest.mark.parametrize("topic", ["", ".", "..", "a b", "ä", "x" * 250])
def test_invalid_topic_names_are_rejected(topic: str) -> None:
    with pytest.raises(ValidationError, match="topic"):
        order(topic=topic)


# --- key ----------------------------------------------------------------------------------------


def test_key_is_derived_from_key_field() -> None:
    assert order().key == "c-7"
    assert Counted(counter=42).key == "42"
    sensor = UUID("12345678-1234-5678-1234-567812345678")
    assert Reading(sensor=sensor).key == str(sensor)


def test_explicit_key_wins_over_key_field() -> None:
    assert order(key="tenant-1").key == "tenant-1"


def test_key_is_required_without_key_field() -> None:
    with pytest.raises(
        ValidationError, match=re.escape("key is required: pass key=... or declare Plain")
    ):
        Plain(note="n", topic="t")


def test_key_field_must_give_a_non_empty_string() -> None:
    with pytest.raises(ValidationError, match="key_field 'customer_id' is empty"):
        order(customer_id="")


def test_key_field_holding_none_is_rejected() -> None:
    class ByLabel(Event, topic="t", key_field="label"):
        label: str | None = None

    with pytest.raises(ValidationError, match="must hold a string or a number"):
        ByLabel()
    assert ByLabel(label=None, key="explicit").key == "explicit"


@pytest.mark.parametrize("key", ["", "\udc80"])
def test_invalid_explicit_keys_are_rejected(key: str) -> None:
    with pytest.raises(ValidationError, match="key"):
        order(key=key)


# --- id, occurred_at, headers --------------------------------------------------------------------


def test_id_defaults_to_a_fresh_uuid4() -> None:
    first, second = order(), order()
    assert first.id.version == 4
    assert first.id != second.id


def test_occurred_at_defaults_to_now_in_utc() -> None:
    before = datetime.now(UTC)
    event = order()
    assert event.occurred_at.tzinfo is UTC
    assert before <= event.occurred_at <= datetime.now(UTC)


def test_occurred_at_is_normalised_to_utc() -> None:
    local = datetime(2024, 5, 1, 14, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    event = order(occurred_at=local)
    assert event.occurred_at.tzinfo is UTC
    assert event.occurred_at == local
    assert event.occurred_at.hour == 12
    assert event.occurred_at.microsecond == 123456


def test_naive_occurred_at_is_rejected() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        order(occurred_at=datetime(2024, 5, 1, 12, 0))


def test_occurred_at_outside_utc_range_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="out of range once converted to UTC"):
        order(occurred_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))))


@pytest.mark.parametrize("name", ["ce_id", "CE_Type", "ce_", "content-type", "Content-Type"])
def test_protocol_header_names_are_reserved(name: str) -> None:
    with pytest.raises(ValidationError, match="reserved for the wire protocol"):
        order(headers={name: "x"})


def test_free_form_headers() -> None:
    assert order(headers={"traceparent": "00-ab", "": "empty name"}).headers == {
        "traceparent": "00-ab",
        "": "empty name",
    }


# --- model behaviour ------------------------------------------------------------------------------


def test_events_are_frozen() -> None:
    event = order()
    with pytest.raises(ValidationError, match="frozen"):
        event.key = "other"  # type: ignore[misc]


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="extra"):
        order(surprise=1)


def test_payload_is_the_subclass_fields_only() -> None:
    event = order()
    assert event.event_payload() == {
        "order_id": "o-1",
        "customer_id": "c-7",
        "amount": Decimal("9.90"),
    }
    assert event.event_payload(mode="json")["amount"] == "9.90"


def test_equal_fields_make_equal_events() -> None:
    event = order()
    assert OrderPlaced.model_validate_json(event.model_dump_json()) == event


def test_events_are_hashable_even_with_headers() -> None:
    event = order(headers={"a": "b"})
    twin = OrderPlaced.model_validate_json(event.model_dump_json())
    assert {event, twin} == {event}
    assert hash(event) != hash(order())


def test_class_body_assignment_works_like_the_keywords() -> None:
    class Legacy(Event):
        event_type = "legacy.thing"
        event_version = 4
        event_topic = "legacy"
        n: int

    assert (Legacy.event_type, Legacy.event_version) == ("legacy.thing", 4)
    assert Legacy(n=1, key="k").topic == "legacy"
