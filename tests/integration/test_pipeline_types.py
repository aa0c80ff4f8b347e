"""The decoder's two type mappings agree: the payload the JVM decodes (``payload.typed_payload``)
has, field by field, the Spark type of ``schema.spark_schema`` — the type the Python pass
returns and the sinks are written with. The decoder joins both in one ``CASE WHEN``; were a
type to differ, Spark would widen one side silently, or refuse the plan at the first batch."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from pyspark.sql import functions as F

from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.pipeline import spark_schema
from outboxkit.pipeline.fallback import nullable
from outboxkit.pipeline.payload import jvm_decodable, parse_schema, typed_payload
from outboxkit.schemas import Event
from tests.unit.test_spark_schema import Colour, Size

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class Part(BaseModel):
    sku: str
    count: int = Field(ge=0)
    weight: Decimal = Field(max_digits=6, decimal_places=3)


class EveryType(Event, type="test.every_type"):
    text: str
    number: int = Field(gt=-10, lt=10_000)
    ratio: float
    flag: bool
    when: datetime
    uid: UUID
    colour: Colour
    size: Size
    mode: Literal["a", "b"]
    amount: Decimal = Field(ge=0, decimal_places=2)
    price: Decimal = Field(max_digits=10, decimal_places=4)
    tags: list[str]
    counts: list[int]
    part: Part
    parts: list[Part]
    maybe: str | None = None
    maybe_part: Part | None = None


@pytest.mark.parametrize("model", [EveryType, OrderPlaced, PaymentCaptured])
def test_the_jvm_payload_has_the_types_of_spark_schema(spark: Any, model: type[Event]) -> None:
    assert jvm_decodable(model), model
    parsed = F.from_json(F.lit("{}"), parse_schema(model))
    typed = spark.range(1).select(*typed_payload(model, parsed)).schema
    declared = {field.name: field.dataType for field in spark_schema(model).fields}
    assert typed.fieldNames(), model
    for field in typed.fields:
        assert nullable(field.dataType) == nullable(declared[field.name]), field.name
    assert set(declared) - set(typed.fieldNames()) <= {"id", "key", "topic", "occurred_at"} | {
        "headers"
    }
