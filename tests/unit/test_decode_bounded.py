"""Decoding costs time and memory in proportion to the record's size, whatever its shape
(issue #16): a size limit before parsing, and validation that stops after the first errors.

The cost of each pathological shape in ``outboxkit/testing/hostile.py`` is measured at 1 MB in a
fresh process. The ceilings are generous (a loaded 2-core machine); the targets (≤ 50 ms, ≤ 50
MB extra) are measured by ``bench/inbox.py --shapes``. Before the bounded validators, a 1 MB
list of wrong items cost ~0.9 s and +380 MB here, and the other shapes 50-90 MB each."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from outboxkit.schemas import DecodeErrorReason, Event, EventDecodeError, EventRegistry, encode
from outboxkit.schemas.bounded import bounded_validator
from outboxkit.testing.hostile import HEADERS, KEY, REGISTRY, SHAPES, Hostile, measure

CPU_SECONDS_AT_MOST = 0.5
EXTRA_MB_AT_MOST = 40


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_1_mb_record_of_any_shape_costs_little(shape: str) -> None:
    cost = measure(shape, 1_000_000)
    assert cost.seconds <= CPU_SECONDS_AT_MOST, cost
    assert cost.extra_mb <= EXTRA_MB_AT_MOST, cost


def test_the_error_message_keeps_the_first_three_errors_and_a_count() -> None:
    value = SHAPES["unknown_keys"](100_000)
    with pytest.raises(EventDecodeError) as caught:
        REGISTRY.decode(topic="hostile", key=KEY, value=value, headers=HEADERS)
    message = str(caught.value)
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD
    assert message.count("Extra inputs are not permitted") == 3
    assert "k00000000: Extra" in message
    assert "and 7139 more extra inputs are not permitted" in message


def test_a_collection_reports_its_first_bad_item_only() -> None:
    value = b'{"name":"n","tags":["ok",1,2,3],"history":[{"street":1},{"street":2}]}'
    with pytest.raises(EventDecodeError) as caught:
        REGISTRY.decode(topic="hostile", key=KEY, value=value, headers=HEADERS)
    assert str(caught.value) == (
        "test.hostile v1: tags.1: Input should be a valid string; "
        "history.0.street: Input should be a valid string"
    )


def test_a_record_over_the_limit_is_rejected_before_parsing() -> None:
    value = b'{"name":"' + b"x" * 2000 + b'"}'
    event = REGISTRY.decode(topic="hostile", key=KEY, value=value, headers=HEADERS)
    assert isinstance(event, Hostile)
    with pytest.raises(EventDecodeError, match="over the decoder's limit of 1000") as caught:
        REGISTRY.decode(topic="hostile", key=KEY, value=value, headers=HEADERS, max_bytes=1000)
    assert caught.value.reason is DecodeErrorReason.TOO_LARGE
    garbage = b"\xff" * 5000  # not even looked at
    with pytest.raises(EventDecodeError) as caught:
        REGISTRY.decode(topic="hostile", key=KEY, value=garbage, headers=HEADERS, max_bytes=1000)
    assert caught.value.reason is DecodeErrorReason.TOO_LARGE


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    values: list[int] = Field(default_factory=list)


class Nested(Event, type="test.nested", topic="nested", key_field="name"):
    name: str
    inner: Inner
    inners: list[Inner] = Field(default_factory=list)


def test_the_bounded_validator_gives_the_same_events() -> None:
    """Same classes (nested ones too), same values, same fields set: only the errors change."""
    event = Nested(name="n", inner=Inner(values=[1, 2]), inners=[Inner(), Inner(values=[3])])
    wire = encode(event, source="s")
    registry = EventRegistry()
    registry.register(Nested)
    decoded = registry.decode(
        topic=wire.topic, key=wire.key, value=wire.value, headers=wire.headers
    )
    assert decoded == event
    assert type(decoded.inner) is Inner  # type: ignore[attr-defined]
    assert (
        decoded.model_fields_set
        == Nested.model_validate_json(event.model_dump_json()).model_fields_set
    )
    assert decoded.inner.__pydantic_extra__ is None  # type: ignore[attr-defined]


def test_building_a_bounded_validator_leaves_the_models_as_they_were() -> None:
    validator = bounded_validator(Nested)
    assert Inner.__pydantic_complete__ is True
    assert Nested.__pydantic_complete__ is True
    assert validator is not Nested.__pydantic_validator__
    assert Inner.model_validate({"values": [1]}) == Inner(values=[1])
