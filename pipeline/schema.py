"""Pydantic model → Spark ``StructType``: one function, :func:`spark_schema`.

The mapping follows the model's JSON-mode meaning, since that is what travels on the wire:

==========================================  ===================================================
Python / Pydantic                            Spark
==========================================  ===================================================
``str``, ``UUID``, str-valued ``Enum``,      ``StringType``
``Literal`` of strings
``int``, int-valued ``Enum``                 ``LongType``
``float``                                    ``DoubleType``
``bool``                                     ``BooleanType``
``Decimal``                                  ``DecimalType(max_digits or 38, decimal_places)``;
                                             ``DecimalType(38, 18)`` without ``decimal_places``
``datetime`` (aware or naive)                ``TimestampType`` (an instant, UTC)
``date``                                     ``DateType``
``bytes``                                    ``BinaryType``
``list`` / ``tuple[X, ...]`` / ``set``       ``ArrayType``
``dict[K, V]``                               ``MapType``
a nested ``BaseModel``                       ``StructType`` (recursively)
``X | None``                                 ``X``, nullable
==========================================  ===================================================

A field is nullable exactly when its annotation admits ``None``. Anything else (``Any``, unions
of several types, ``timedelta``, recursive models…) raises :class:`SchemaMappingError` naming
the field, so a model the pipeline cannot carry fails at start, not on the first record.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, NaiveDatetime
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
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

from outboxkit.pipeline.exceptions import SchemaMappingError

#: Spark's widest decimal, and the scale used when a model does not say (``decimal_places``).
MAX_PRECISION = 38
DEFAULT_SCALE = 18

_ARRAYS = (list, tuple, set, frozenset, Sequence, typing.AbstractSet)
_MAPS = (dict, Mapping)


def spark_schema(model: type[BaseModel]) -> StructType:
    """The Spark schema of ``model``'s instances, one field per model field (by alias)."""
    return _struct(model, path=model.__name__, seen=())


def _struct(model: type[BaseModel], *, path: str, seen: tuple[type[BaseModel], ...]) -> StructType:
    if model in seen:
        raise SchemaMappingError(f"{path}: {model.__name__} is recursive; Spark has no such type")
    fields = []
    for name, info in model.model_fields.items():
        where = f"{path}.{name}"
        data_type, nullable = _map(info.annotation, tuple(info.metadata), where, (*seen, model))
        fields.append(StructField(info.alias or name, data_type, nullable=nullable))
    return StructType(fields)


def _map(
    annotation: Any, metadata: tuple[Any, ...], where: str, seen: tuple[type[BaseModel], ...]
) -> tuple[DataType, bool]:
    """``(spark type, nullable)`` of one annotation plus the constraints attached to it."""
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return _map(inner, (*metadata, *extra), where, seen)
    if origin in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) != 1:
            raise SchemaMappingError(
                f"{where}: a union of {', '.join(map(_name, members))} has no Spark type; "
                "use one type (optionally | None)"
            )
        data_type, _ = _map(members[0], metadata, where, seen)
        return data_type, len(members) < len(get_args(annotation))
    if annotation is None or annotation is type(None):
        raise SchemaMappingError(f"{where}: a field that is always None has no Spark type")
    return _map_plain(annotation, origin, metadata, where, seen), False


def _map_plain(
    annotation: Any,
    origin: Any,
    metadata: tuple[Any, ...],
    where: str,
    seen: tuple[type[BaseModel], ...],
) -> DataType:
    if origin is Literal:
        return literal_type(get_args(annotation), where)
    if origin is not None:
        return _generic(annotation, origin, where, seen)
    if not isinstance(annotation, type):
        raise SchemaMappingError(f"{where}: {annotation!r} has no Spark type")
    if issubclass(annotation, BaseModel):
        return _struct(annotation, path=where, seen=seen)
    if issubclass(annotation, Enum):
        return literal_type(tuple(member.value for member in annotation), where)
    if issubclass(annotation, bool):
        return BooleanType()
    if issubclass(annotation, int):
        return LongType()
    if issubclass(annotation, float):
        return DoubleType()
    if issubclass(annotation, Decimal):
        return decimal_type(metadata, where)
    if issubclass(annotation, datetime) or annotation in (AwareDatetime, NaiveDatetime):
        return TimestampType()
    if issubclass(annotation, date):
        return DateType()
    if issubclass(annotation, str | UUID):
        return StringType()
    if issubclass(annotation, bytes):
        return BinaryType()
    raise SchemaMappingError(f"{where}: {_name(annotation)} has no Spark type")


def _generic(
    annotation: Any, origin: Any, where: str, seen: tuple[type[BaseModel], ...]
) -> DataType:
    args = get_args(annotation)
    if isinstance(origin, type) and issubclass(origin, _MAPS):
        if len(args) != 2:
            raise SchemaMappingError(f"{where}: give the key and value types, e.g. dict[str, int]")
        key_type, key_nullable = _map(args[0], (), f"{where}[key]", seen)
        if key_nullable:
            raise SchemaMappingError(f"{where}: map keys cannot be None in Spark")
        value_type, value_nullable = _map(args[1], (), f"{where}[value]", seen)
        return MapType(key_type, value_type, valueContainsNull=value_nullable)
    if isinstance(origin, type) and issubclass(origin, _ARRAYS):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise SchemaMappingError(
                f"{where}: only tuple[X, ...] maps to an array; a fixed tuple has no Spark type"
            )
        if not args:
            raise SchemaMappingError(f"{where}: give the element type, e.g. list[str]")
        element, element_nullable = _map(args[0], (), f"{where}[]", seen)
        return ArrayType(element, containsNull=element_nullable)
    raise SchemaMappingError(f"{where}: {annotation!r} has no Spark type")


def literal_type(values: tuple[Any, ...], where: str) -> DataType:
    """The type of a field whose values are ``values`` (a ``Literal``'s, an ``Enum``'s)."""
    if values and all(isinstance(v, bool) for v in values):
        return BooleanType()
    if values and all(isinstance(v, str) for v in values):
        return StringType()
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return LongType()
    raise SchemaMappingError(
        f"{where}: the values {values!r} are not all strings or all integers; no Spark type"
    )


def decimal_type(metadata: tuple[Any, ...], where: str) -> DecimalType:
    """The type of a ``Decimal`` field: its ``max_digits`` and ``decimal_places`` when it has
    them (a column that holds each valid value exactly), 38 digits with 18 places otherwise."""
    max_digits = _constraint(metadata, "max_digits")
    places = _constraint(metadata, "decimal_places")
    if places is None:
        return DecimalType(MAX_PRECISION, DEFAULT_SCALE)
    precision = max_digits if max_digits is not None else MAX_PRECISION
    if precision > MAX_PRECISION or places > precision:
        raise SchemaMappingError(
            f"{where}: Decimal(max_digits={max_digits}, decimal_places={places}) does not fit "
            f"Spark's decimal (at most {MAX_PRECISION} digits, scale <= precision)"
        )
    return DecimalType(precision, places)


def _constraint(metadata: tuple[Any, ...], name: str) -> int | None:
    for item in metadata:
        value = getattr(item, name, None)
        if isinstance(value, int):
            return value
    return None


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)
