"""A record's JSON payload, recognised and typed on the JVM with Spark SQL expressions.

The pipeline must reach exactly the verdict of the Python decoder
(:meth:`outboxkit.schemas.EventRegistry.decode`, i.e. Pydantic's ``model_validate_json``) for
every record. Pydantic's lax mode (``"12"`` for an int, ``1e3`` for a Decimal, any ISO 8601
variant, ``"yes"`` for a bool…) and user validators cannot be written in Spark SQL, so the JVM
does not try to *reject* payloads. It only *accepts* the payloads it can prove valid: the
**canonical** ones, whose text is exactly what a JSON encoder writes for the values Spark read
(``to_json(from_json(text)) == text``), of a model whose every field has a type and constraints
listed below, and whose values pass those constraints. Every other payload — invalid, or valid
but written another way — is left *undecided* and goes to the Python pass
(:mod:`outboxkit.pipeline.fallback`), which runs the registry itself. Records written by
:func:`outboxkit.schemas.encode` (the relay's) are canonical, so Python never sees a good
record of a supported model.

Why the round trip proves validity: when the text is the JSON encoding of the parsed values,
any JSON parser — Python's included — reads the same values from it; the type of each JSON
token is pinned by the encoding (a string where the model has ``str``, a number where it has
``int``…); there are no missing, extra or duplicate keys; so Pydantic's outcome depends only on
the values and the constraints, which are checked here with the same rules.

Supported for the JVM path (anything else makes the model Python-decoded, see
:func:`jvm_decodable`):

===============================  ============================================================
field type                        canonical JSON and checks
===============================  ============================================================
``str``                           a string; ``min_length`` / ``max_length`` (code points)
``int``, ``float``, ``bool``      a number / ``true`` ``false``; ``gt ge lt le`` (floats: finite)
``Decimal``                       a string ``-?digits[.digits]`` (as Pydantic dumps it);
                                  ``gt ge lt le max_digits decimal_places`` with Pydantic's
                                  normalisation (trailing zeros do not count)
``datetime`` / ``AwareDatetime``  a string ``YYYY-MM-DDTHH:MM:SS[.ffffff](Z|±HH:MM)``
``date``                          a string ``YYYY-MM-DD``
``UUID``                          a string in canonical lower-case form
``Enum`` / ``Literal``            a string or integer member
nested ``BaseModel``              an object, recursively (same conditions on the model)
``list[X]`` / ``tuple[X, ...]``   an array; ``min_length`` / ``max_length``
``X | None``                      ``null`` allowed
===============================  ============================================================

Accepted values are typed as :func:`~outboxkit.pipeline.schema.spark_schema` types them, the type
the Python pass returns and the sinks are written with: a ``Decimal``'s precision and scale and
the type of a ``Literal``'s or an ``Enum``'s members come from there, and
``tests/integration/test_pipeline_types.py`` holds every other type to it, field by field.
"""

from __future__ import annotations

import collections.abc
import math
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from uuid import UUID

import annotated_types as at
from pydantic import AwareDatetime, BaseModel
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from outboxkit.pipeline.arrays import all_compare, all_finite, all_match, all_members, no_nulls
from outboxkit.pipeline.exceptions import SchemaMappingError
from outboxkit.pipeline.schema import decimal_type, literal_type
from outboxkit.schemas import Event
from outboxkit.schemas.event import ENVELOPE_FIELDS

#: Model configuration keys that do not change what validation accepts or produces from JSON.
_NEUTRAL_CONFIG = frozenset(
    {
        "title",
        "frozen",
        "extra",  # extra keys never pass the round trip, whatever the model does with them
        "json_schema_extra",
        "json_schema_mode_override",
        "json_schema_serialization_defaults_required",
        "use_enum_values",
        "validate_assignment",
        "populate_by_name",
        "validate_by_name",
        "serialize_by_alias",
        "protected_namespaces",
        "ser_json_timedelta",
        "ser_json_temporal",
        "ser_json_bytes",
        "ser_json_inf_nan",
        "defer_build",
        "from_attributes",
        "revalidate_instances",
        "hide_input_in_errors",
        "use_attribute_docstrings",
        "cache_strings",
        "loc_by_alias",
        "alias_generator",  # aliases are read from the fields
        "plugin_settings",
        "validation_error_cause",
        "regex_engine",
        "arbitrary_types_allowed",
        "validate_default",  # every field is present in a canonical payload
    }
)

_UUID_BODY = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# Years 0002-9998 only: an offset can move an instant of year 1 or 9999 out of range.
_YEAR = r"(?!0000|0001|9999)[0-9]{4}"
_DATE = rf"{_YEAR}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
_OFFSET = r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_DATETIME = rf"^{_DATE}T{_TIME}{_OFFSET}\z"
_DATETIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX"
_DECIMAL = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?\z"


class NotJvmDecodable(Exception):
    """The model (or one of its fields) is outside what the JVM path supports."""


@dataclass(frozen=True)
class _Field:
    """How one JSON value is read (``parse``), checked (``check``) and typed (``typed``)."""

    parse: DataType
    check: Callable[[Column], Column]
    typed: Callable[[Column], Column]
    nullable: bool = False
    key: str = ""
    name: str = ""
    children: tuple[_Field, ...] = field(default=())
    each: Callable[[Column], Column] | None = None
    """``check`` over a whole array of values, without a lambda (see :func:`_items`): true when
    every non-null entry passes (a struct's: every entry, none of which may be null); ``None``
    when only a lambda can say it."""
    cast: DataType | None = None
    """The type ``typed`` gives: on accepted values ``typed(c)`` is ``c.try_cast(cast)``, so
    that an array of them is typed with one cast; ``None`` when it is not a cast."""


def jvm_decodable(model: type[Event]) -> bool:
    """Whether the JVM path can decide ``model``'s valid payloads (see the module's table)."""
    try:
        _payload_fields(model)
    except NotJvmDecodable:
        return False
    return True


def why_not_jvm_decodable(model: type[Event]) -> str | None:
    """The reason :func:`jvm_decodable` is false, for the start-up log; ``None`` when true."""
    try:
        _payload_fields(model)
    except NotJvmDecodable as exc:
        return str(exc)
    return None


def parse_schema(model: type[Event]) -> StructType:
    """The schema ``from_json`` reads a canonical payload of ``model`` with."""
    return StructType([StructField(f.key, f.parse, nullable=True) for f in _payload_fields(model)])


def payload_checks(model: type[Event], parsed: Column) -> Column:
    """True when the parsed payload's values pass the model's constraints."""
    checks = [_checked(f, parsed[f.key]) for f in _payload_fields(model)]
    return _all(checks)


def typed_payload(model: type[Event], parsed: Column) -> list[Column]:
    """The payload fields as the model's Spark types (see :mod:`outboxkit.pipeline.schema`),
    aliased with the struct field names of :func:`~outboxkit.pipeline.schema.spark_schema`."""
    return [f.typed(parsed[f.key]).alias(f.key) for f in _payload_fields(model)]


# --- classification -----------------------------------------------------------------------------

_EVENT_VALIDATORS = {
    kind: set(getattr(Event.__pydantic_decorators__, kind))
    for kind in ("validators", "field_validators", "root_validators", "model_validators")
}


def _check_model(model: type[BaseModel], base: type[BaseModel] | None) -> None:
    name = model.__name__
    extra_config = set(model.model_config) - _NEUTRAL_CONFIG
    if extra_config:
        raise NotJvmDecodable(f"{name}: model_config {', '.join(sorted(extra_config))}")
    for kind, allowed in _EVENT_VALIDATORS.items():
        found = set(getattr(model.__pydantic_decorators__, kind))
        if found - (allowed if base is Event else set()):
            raise NotJvmDecodable(f"{name}: has its own validators")
    if getattr(model, "__pydantic_post_init__", None):
        raise NotJvmDecodable(f"{name}: defines model_post_init")
    if model.__pydantic_generic_metadata__.get("origin") or getattr(
        model, "__pydantic_root_model__", False
    ):
        raise NotJvmDecodable(f"{name}: generic and root models are not supported")


_CACHE: dict[type[BaseModel], tuple[_Field, ...]] = {}


def _payload_fields(model: type[Event]) -> tuple[_Field, ...]:
    cached = _CACHE.get(model)
    if cached is not None:
        return cached
    _check_model(model, Event)
    fields = _model_fields(model, names=model.event_payload_fields)
    if any(f.key in ENVELOPE_FIELDS for f in fields):
        raise NotJvmDecodable(f"{model.__name__}: a payload alias is an envelope field name")
    _CACHE[model] = fields
    return fields


def _model_fields(model: type[BaseModel], names: Sequence[str]) -> tuple[_Field, ...]:
    result = []
    for name in names:
        info = model.model_fields[name]
        key = info.alias or name
        if info.validation_alias is not None and info.validation_alias != key:
            raise NotJvmDecodable(f"{model.__name__}.{name}: validation_alias")
        where = f"{model.__name__}.{name}"
        spec = _map(info.annotation, tuple(info.metadata), where)
        result.append(_Field(**{**spec.__dict__, "key": key, "name": name}))
    return tuple(result)


def _map(annotation: Any, metadata: tuple[Any, ...], where: str) -> _Field:
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return _map(inner, (*metadata, *extra), where)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) != 1 or len(members) == len(get_args(annotation)):
            raise NotJvmDecodable(f"{where}: a union")
        inner = _map(members[0], metadata, where)
        return _Field(**{**inner.__dict__, "nullable": True})
    return _plain(annotation, origin, metadata, where)


def _plain(annotation: Any, origin: Any, metadata: tuple[Any, ...], where: str) -> _Field:
    if origin is Literal:
        return _members(get_args(annotation), metadata, where)
    if origin in (list, tuple, collections.abc.Sequence):
        return _array(annotation, origin, metadata, where)
    if origin is not None or not isinstance(annotation, type):
        raise NotJvmDecodable(f"{where}: {annotation!r}")
    if issubclass(annotation, BaseModel):
        _no_constraints(metadata, where)
        return _struct(annotation, where)
    if issubclass(annotation, Enum):
        return _members(tuple(m.value for m in annotation), metadata, where)
    if issubclass(annotation, bool):
        _no_constraints(metadata, where)
        return _Field(BooleanType(), _true, _same, each=_true, cast=BooleanType())
    if issubclass(annotation, int):
        bounds = _bounds(metadata, where, allowed=())
        return _Field(
            LongType(),
            lambda c: _all([_compare(*b)(c) for b in bounds]),
            _same,
            each=lambda a: _all([all_compare(*b)(a) for b in bounds]),
            cast=LongType(),
        )
    if issubclass(annotation, float):
        bounds = _bounds(metadata, where, allowed=())
        return _Field(
            DoubleType(),
            lambda c: _all([_finite(c), *(_compare(*b)(c) for b in bounds)]),
            _same,
            each=lambda a: _all([all_finite(a), *(all_compare(*b)(a) for b in bounds)]),
            cast=DoubleType(),
        )
    if issubclass(annotation, Decimal):
        return _decimal(metadata, where)
    if annotation is AwareDatetime or (
        issubclass(annotation, datetime) and annotation.__name__ != "NaiveDatetime"
    ):
        _no_constraints(metadata, where)
        return _Field(
            StringType(),
            lambda c: (
                c.rlike(_DATETIME) & F.try_to_timestamp(c, F.lit(_DATETIME_FORMAT)).isNotNull()
            ),
            lambda c: F.try_to_timestamp(c, F.lit(_DATETIME_FORMAT)),
        )
    if issubclass(annotation, date) and not issubclass(annotation, datetime):
        _no_constraints(metadata, where)
        return _Field(
            StringType(),
            lambda c: c.rlike(rf"^{_DATE}\z") & F.try_to_date(c, "yyyy-MM-dd").isNotNull(),
            lambda c: F.try_to_date(c, "yyyy-MM-dd"),
        )
    if issubclass(annotation, UUID):
        _no_constraints(metadata, where)
        return _Field(
            StringType(),
            lambda c: c.rlike(rf"^{_UUID_BODY}\z"),
            _same,
            each=all_match(_UUID_BODY),
            cast=StringType(),
        )
    if annotation is str:
        lengths = _lengths(metadata, where)
        return _Field(
            StringType(),
            lambda c: _all([b(F.char_length(c)) for b in lengths]),
            _same,
            each=None if lengths else _true,
            cast=StringType(),
        )
    raise NotJvmDecodable(f"{where}: {getattr(annotation, '__name__', annotation)!r}")


def _struct(model: type[BaseModel], where: str) -> _Field:
    _check_model(model, None)
    children = _model_fields(model, names=list(model.model_fields))
    parse = StructType([StructField(f.key, f.parse, nullable=True) for f in children])

    def check(c: Column) -> Column:
        return _all([_checked(f, c[f.key]) for f in children])

    def typed(c: Column) -> Column:
        return F.when(c.isNotNull(), F.struct(*(f.typed(c[f.key]).alias(f.key) for f in children)))

    each = None
    if all(f.each is not None and not (f.nullable and f.children) for f in children):

        def each(a: Column) -> Column:
            # a[key] is the array of that field's values (null where the field is).
            return _all([_items(f)(a[f.key]) for f in children])

    casts = [f.cast for f in children]
    cast = (
        StructType([StructField(f.key, t) for f, t in zip(children, casts, strict=True) if t])
        if all(casts)
        else None
    )
    return _Field(parse, check, typed, children=children, each=each, cast=cast)


def _array(annotation: Any, origin: Any, metadata: tuple[Any, ...], where: str) -> _Field:
    args = get_args(annotation)
    if origin is tuple:
        if not (len(args) == 2 and args[1] is Ellipsis):
            raise NotJvmDecodable(f"{where}: a fixed tuple")
        args = args[:1]
    if len(args) != 1:
        raise NotJvmDecodable(f"{where}: an array without its element type")
    element = _map(args[0], (), f"{where}[]")
    lengths = _lengths(metadata, where)

    items = _items(element)

    def check(c: Column) -> Column:
        return _all([items(c), *(b(F.size(c)) for b in lengths)])

    if element.cast is None:
        return _Field(
            ArrayType(element.parse, containsNull=True),
            check,
            lambda c: F.transform(c, element.typed),
        )
    cast = ArrayType(element.cast, containsNull=True)
    return _Field(
        ArrayType(element.parse, containsNull=True), check, lambda c: c.try_cast(cast), cast=cast
    )


def _items(element: _Field) -> Callable[[Column], Column]:
    """True when every entry of an array passes ``element``'s checks (nulls only if nullable).

    Without a lambda where the element allows it (``each``, see :mod:`.arrays`): Spark
    interprets lambda functions and a projection holding one is not compiled as a whole."""
    each = element.each
    if each is None or (element.nullable and element.children):
        return lambda c: F.forall(c, lambda x: _checked(element, x))
    if element.nullable or any(not f.nullable for f in element.children):
        return each  # nulls allowed, or rejected by a required field's own check
    return lambda c: no_nulls(c, element.parse) & each(c)


def _members(values: tuple[Any, ...], metadata: tuple[Any, ...], where: str) -> _Field:
    _no_constraints(metadata, where)
    if not values or not all(type(v) in (str, int) for v in values):
        raise NotJvmDecodable(f"{where}: members that are not all strings or all integers")
    try:
        kind = literal_type(values, where)
    except SchemaMappingError as exc:
        raise NotJvmDecodable(str(exc)) from None
    members = F.array(*(F.lit(v) for v in values)).cast(ArrayType(kind))
    return _Field(kind, lambda c: c.isin(*values), _same, each=all_members(members), cast=kind)


def _decimal(metadata: tuple[Any, ...], where: str) -> _Field:
    bounds = _bounds(metadata, where, allowed=("max_digits", "decimal_places"))
    max_digits = _general(metadata, "max_digits")
    places = _general(metadata, "decimal_places")
    try:
        spark_type = decimal_type(metadata, where)  # the column the sinks are written with
    except SchemaMappingError as exc:
        raise NotJvmDecodable(str(exc)) from None
    precision, scale = spark_type.precision, spark_type.scale

    def parts(c: Column) -> tuple[Column, Column]:
        whole = F.regexp_extract(c, r"^-?0*([0-9]*)", 1)
        fraction = F.regexp_extract(c, r"\.([0-9]*?)0*$", 1)
        return F.char_length(whole), F.char_length(fraction)

    # With decimal_places (precision = max_digits or 38) Pydantic's digit rules are the column's:
    # one regular expression says it all; max_digits alone also limits whole + fraction digits.
    joint = places is None and max_digits is not None
    pattern = None if joint else _decimal_pattern(precision - scale, scale)

    def check(c: Column) -> Column:
        if pattern is not None:
            rules = [c.rlike(rf"^{pattern}\z")]
        else:
            whole, fraction = parts(c)
            # Exactly representable in the column (no rounding, no overflow)…
            rules = [c.rlike(_DECIMAL), whole <= precision - scale, fraction <= scale]
            # …and Pydantic's own digit rule, on the normalised value.
            rules.append(F.greatest(whole + fraction, F.lit(1)) <= F.lit(max_digits))
        value = c.try_cast(spark_type)
        return _all([*rules, value.isNotNull(), *(_compare(*b)(value) for b in bounds)])

    def each(a: Column) -> Column:
        assert pattern is not None
        values = a.try_cast(ArrayType(spark_type))
        return all_match(pattern)(a) & _all([all_compare(*b)(values) for b in bounds])

    return _Field(
        StringType(),
        check,
        lambda c: c.try_cast(spark_type),
        each=each if pattern is not None else None,
        cast=spark_type,
    )


def _decimal_pattern(whole: int, fraction: int) -> str:
    """A decimal string ``-?digits[.digits]`` (no leading zeros) with at most ``whole`` digits
    before the point and ``fraction`` after it once trailing zeros are dropped, as Pydantic
    normalises it."""
    integer = f"[1-9][0-9]{{0,{whole - 1}}}|0" if whole > 0 else "0"
    return rf"-?({integer})(\.(?=[0-9])[0-9]{{0,{fraction}}}0*)?"


# --- constraints ----------------------------------------------------------------------------------

_Rule = Callable[[Column], Column]


def _compare(op: str, bound: object) -> _Rule:
    def rule(c: Column) -> Column:
        value = F.lit(bound)
        return {"gt": c > value, "ge": c >= value, "lt": c < value, "le": c <= value}[op]

    return rule


def _bounds(
    metadata: tuple[Any, ...], where: str, *, allowed: tuple[str, ...]
) -> list[tuple[str, object]]:
    """The ``gt ge lt le`` constraints as (op, bound); any other constraint but ``allowed``
    ones makes the field Python-decoded."""
    rules: list[tuple[str, object]] = []
    for item in metadata:
        op = {at.Gt: "gt", at.Ge: "ge", at.Lt: "lt", at.Le: "le"}.get(type(item))
        if op is not None and _number(getattr(item, op)):
            rules.append((op, getattr(item, op)))
        elif not _general_only(item, allowed):
            raise NotJvmDecodable(f"{where}: constraint {item!r}")
    return rules


def _length(op: str, bound: int) -> _Rule:
    def rule(n: Column) -> Column:
        return n >= bound if op == "min" else n <= bound

    return rule


def _lengths(metadata: tuple[Any, ...], where: str) -> list[_Rule]:
    rules: list[_Rule] = []
    for item in metadata:
        if isinstance(item, at.MinLen):
            rules.append(_length("min", item.min_length))
        elif isinstance(item, at.MaxLen):
            rules.append(_length("max", item.max_length))
        else:
            raise NotJvmDecodable(f"{where}: constraint {item!r}")
    return rules


def _no_constraints(metadata: tuple[Any, ...], where: str) -> None:
    if metadata:
        raise NotJvmDecodable(f"{where}: constraint {metadata[0]!r}")


def _number(value: object) -> bool:
    return type(value) in (int, Decimal) or (type(value) is float and not math.isnan(value))


def _general_only(item: object, allowed: tuple[str, ...]) -> bool:
    """Pydantic's ``_PydanticGeneralMetadata`` holding only the ``allowed`` constraints."""
    if type(item).__name__ != "_PydanticGeneralMetadata":
        return False
    return set(vars(item)) <= set(allowed)


def _general(metadata: tuple[Any, ...], name: str) -> int | None:
    for item in metadata:
        value = getattr(item, name, None)
        if type(item).__name__ == "_PydanticGeneralMetadata" and isinstance(value, int):
            return value
    return None


# --- helpers --------------------------------------------------------------------------------------


def _checked(spec: _Field, value: Column) -> Column:
    """``spec``'s checks on ``value``, which may be null only when the field is nullable."""
    if spec.nullable:
        return value.isNull() | spec.check(value)
    return value.isNotNull() & spec.check(value)


def _all(checks: Sequence[Column]) -> Column:
    result = F.lit(True)
    for check in checks:
        result = result & check
    return result


def _finite(c: Column) -> Column:
    return ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))


def _true(_: Column) -> Column:
    return F.lit(True)


def _same(c: Column) -> Column:
    return c
