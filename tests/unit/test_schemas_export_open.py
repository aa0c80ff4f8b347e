"""The exported schema says what the reader accepts: open objects for a tolerant reader (a
field a newer producer added validates, as outboxkit's reader ignores it), closed ones for a
``strict_reader`` type; a changed type fails either way. Validated with ``jsonschema``, as a
consumer in another language would with the file that ``ce_dataschema`` names."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict

from outboxkit.schemas import Event
from outboxkit.schemas.snapshot import payload_schema


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
