"""Pydantic model → Spark StructType (outboxkit.pipeline.schema)."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from pydantic import AwareDatetime, BaseModel, Field, condecimal

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from outboxkit.demo.events import OrderPlaced
from outboxkit.pipeline import SchemaMappingError, spark_schema


class Colour(StrEnum):
    RED = "red"


class Size(IntEnum):
    S = 1
    L = 3


class Inner(BaseModel):
    n: int
    tags: list[str] = []


class Everything(BaseModel):
    text: str
    number: int
    ratio: float
    flag: bool
    when: datetime
    aware: AwareDatetime
    day: date
    uid: UUID
    blob: bytes
    colour: Colour
    size: Size
    mode: Literal["a", "b"]
    money: Decimal
    price: Decimal = Field(decimal_places=2)
    exact: Annotated[Decimal, Field(max_digits=10, decimal_places=4)]
    legacy: condecimal(max_digits=12, decimal_places=3)  # type: ignore[valid-type]
    maybe: str | None = None
    inner: Inner
    inners: list[Inner]
    optional_inner: Inner | None = None
    scores: dict[str, float]
    maybe_numbers: list[int | None]
    frozen: frozenset[str]
    many: tuple[int, ...]
    aliased: int = Field(alias="Aliased")


def _field(schema: StructType, name: str) -> StructField:
    return schema[name]


def test_scalars_map_to_their_spark_types() -> None:
    schema = spark_schema(Everything)
    expected = {
        "text": StringType(),
        "number": LongType(),
        "ratio": DoubleType(),
        "flag": BooleanType(),
        "when": TimestampType(),
        "aware": TimestampType(),
        "day": DateType(),
        "uid": StringType(),
        "blob": BinaryType(),
        "colour": StringType(),
        "size": LongType(),
        "mode": StringType(),
    }
    for name, data_type in expected.items():
        assert _field(schema, name).dataType == data_type, name
        assert _field(schema, name).nullable is False, name


def test_decimals_take_precision_and_scale_from_the_constraints() -> None:
    schema = spark_schema(Everything)
    assert _field(schema, "money").dataType == DecimalType(38, 18)
    assert _field(schema, "price").dataType == DecimalType(38, 2)
    assert _field(schema, "exact").dataType == DecimalType(10, 4)
    assert _field(schema, "legacy").dataType == DecimalType(12, 3)


def test_optionals_are_nullable_and_keep_their_type() -> None:
    schema = spark_schema(Everything)
    assert _field(schema, "maybe") == StructField("maybe", StringType(), nullable=True)
    optional_inner = _field(schema, "optional_inner")
    assert optional_inner.nullable is True
    assert optional_inner.dataType == _field(schema, "inner").dataType


def test_nested_models_and_containers() -> None:
    schema = spark_schema(Everything)
    inner = StructType(
        [
            StructField("n", LongType(), nullable=False),
            StructField("tags", ArrayType(StringType(), containsNull=False), nullable=False),
        ]
    )
    assert _field(schema, "inner").dataType == inner
    assert _field(schema, "inners").dataType == ArrayType(inner, containsNull=False)
    assert _field(schema, "scores").dataType == MapType(
        StringType(), DoubleType(), valueContainsNull=False
    )
    assert _field(schema, "maybe_numbers").dataType == ArrayType(LongType(), containsNull=True)
    assert _field(schema, "frozen").dataType == ArrayType(StringType(), containsNull=False)
    assert _field(schema, "many").dataType == ArrayType(LongType(), containsNull=False)


def test_fields_are_named_by_alias_in_declaration_order() -> None:
    names = spark_schema(Everything).fieldNames()
    assert names[-1] == "Aliased"
    assert names[:3] == ["text", "number", "ratio"]


def test_the_shop_event_includes_the_envelope() -> None:
    schema = spark_schema(OrderPlaced)
    assert schema.fieldNames() == [
        "id",
        "key",
        "topic",
        "occurred_at",
        "headers",
        "order_id",
        "customer_id",
        "currency",
        "lines",
        "amount",
        "note",
    ]
    assert schema["occurred_at"].dataType == TimestampType()
    assert schema["headers"].dataType == MapType(StringType(), StringType(), False)
    assert schema["amount"].dataType == DecimalType(38, 2)
    assert schema["note"].nullable is True
    line = schema["lines"].dataType
    assert isinstance(line, ArrayType)
    assert line.elementType["unit_price"].dataType == DecimalType(38, 2)
    assert line.elementType["quantity"].dataType == LongType()


class _Any(BaseModel):
    value: Any


class _Union(BaseModel):
    value: int | str


class _FixedTuple(BaseModel):
    value: tuple[int, str]


class _Mixed(BaseModel):
    value: Literal["a", 1]


class _TooPrecise(BaseModel):
    value: Decimal = Field(max_digits=40, decimal_places=2)


class _Node(BaseModel):
    child: _Node | None = None


@pytest.mark.parametrize(
    ("model", "field", "words"),
    [
        (_Any, "value", "Any"),
        (_Union, "value", "union"),
        (_FixedTuple, "value", "fixed tuple"),
        (_Mixed, "value", "not all strings"),
        (_TooPrecise, "value", "does not fit"),
        (_Node, "child", "recursive"),
    ],
)
def test_unmappable_fields_are_named_in_the_error(
    model: type[BaseModel], field: str, words: str
) -> None:
    with pytest.raises(SchemaMappingError) as caught:
        spark_schema(model)
    assert f"{model.__name__}.{field}" in str(caught.value)
    assert words in str(caught.value)
