"""The exported schema says what the reader accepts: open objects for a tolerant reader (a
field a newer producer added validates, as outboxkit's reader ignores it), closed ones for a
``strict_reader`` type; a changed type fails either way. Validated with ``jsonschema``, as a
consumer in another language would with the file that ``ce_dataschema`` names."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field

from outboxkit.schemas import Event, encode
from outboxkit.schemas.compat.snapshot import payload_schema


class Line(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sku: str


class Order(Event, type="test.open.order", topic="t"):
    order_id: str
    line: Line
    additionalProperties: bool = False  # a field named like the keyword: data, kept


class StrictOrder(Order, type="test.open.strict", strict_reader=True):
    pass


def valid(model: type[Event], payload: dict[str, Any]) -> bool:
    return Draft202012Validator(payload_schema(model)).is_valid(payload)


GOOD = {"order_id": "o-1", "line": {"sku": "s"}, "additionalProperties": True}


def test_a_tolerant_readers_schema_accepts_an_added_field_at_every_level() -> None:
    assert valid(Order, GOOD)
    assert valid(Order, {**GOOD, "gift_wrap": True})
    assert valid(Order, {**GOOD, "line": {"sku": "s", "colour": "red"}})
    assert "additionalProperties" in payload_schema(Order)["properties"]


def test_a_strict_readers_schema_refuses_an_added_field() -> None:
    assert valid(StrictOrder, GOOD)
    assert not valid(StrictOrder, {**GOOD, "gift_wrap": True})
    assert not valid(StrictOrder, {**GOOD, "line": {"sku": "s", "colour": "red"}})


@pytest.mark.parametrize("model", [Order, StrictOrder])
def test_a_changed_type_fails_either_schema(model: type[Event]) -> None:
    assert not valid(model, {**GOOD, "order_id": 7})
    assert not valid(model, {**GOOD, "line": {"sku": ["s"]}})


class Priced(Event, type="test.open.priced", topic="t"):
    total: Decimal = Field(max_digits=5, decimal_places=2, ge=0)
    rate: Decimal = Field(max_digits=3)
    cents: Decimal = Field(max_digits=2, decimal_places=2)


PRICED = {"total": "19.80", "rate": "0.5", "cents": "0.05"}


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("total", "twelve"),
        ("total", "19.805"),  # 3 places
        ("total", "1234.5"),  # 4 whole digits
        ("rate", "12.34"),  # 4 digits
        ("cents", "0"),  # a whole digit (pydantic counts the zero)
        ("cents", "1.5"),
    ],
)
def test_a_decimal_that_breaks_its_places_or_digits_fails_the_schema(field: str, text: str) -> None:
    assert valid(Priced, PRICED)
    assert not valid(Priced, {**PRICED, field: text})
    with pytest.raises(ValueError, match=field):
        Priced.model_validate({**PRICED, field: text})


@given(
    st.decimals(min_value=0, max_value=Decimal("999.99"), places=2),
    st.decimals(min_value=-999, max_value=999, places=1)
    | st.sampled_from([Decimal("1E+2"), Decimal("0.5"), Decimal("-0.05")]),
)
@settings(max_examples=200, deadline=None)
def test_every_decimal_the_writer_writes_validates(total: Decimal, rate: Decimal) -> None:
    try:
        event = Priced(total=total, rate=rate, cents=Decimal("0.01"))
    except ValueError:
        return  # not a value of the field
    assert valid(Priced, json.loads(encode(event, source="urn:test").value))
