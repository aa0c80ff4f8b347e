"""Event models generated from a grammar, with values for them (hypothesis strategies).

The round-trip properties (tests/unit/test_schemas_whole.py, the Spark decoder's and the inbox's
in tests/integration) draw models from here: field names from every key pydantic-core's core
schemas and JSON Schema use, Python keywords (through an alias), non-ASCII names and names that
shadow attributes of ``Event`` where pydantic allows it (an alias where it does not); field types
from every type docs/schemas.md supports, nested models, optional, defaulted and union fields;
and values from hypothesis' strategies for each.

A :class:`TypeSpec` is an annotation plus the strategy of its values; :func:`models` draws a
:class:`ModelSpec`, which :func:`build` turns into an ``Event`` subclass (each a new class with
its own type name), and :func:`events` draws an instance.
"""

from __future__ import annotations

import itertools
import keyword
import os
import typing
import warnings
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from enum import IntEnum, StrEnum
from functools import cache
from typing import Annotated, Any, Literal
from uuid import UUID

import pydantic_core.core_schema as core
import typing_extensions
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, create_model

from outboxkit.schemas import Event
from outboxkit.schemas.event import ENVELOPE_FIELDS


class Colour(StrEnum):
    RED = "red"
    METADATA = "metadata"
    TYPE = "type"


class Level(IntEnum):
    LOW = 1
    HIGH = 2


def _core_schema_keys() -> set[str]:
    keys: set[str] = set()
    for name in dir(core):
        candidate = getattr(core, name)
        if typing_extensions.is_typeddict(candidate):
            keys |= set(typing.get_type_hints(candidate))
    return keys


#: JSON Schema's keywords (draft 2020-12) and the annotations outboxkit exports.
JSON_SCHEMA_KEYWORDS = [
    "$schema",
    "$id",
    "$ref",
    "$defs",
    "$anchor",
    "$comment",
    "$dynamicRef",
    "$vocabulary",
    "definitions",
    "type",
    "enum",
    "const",
    "properties",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "required",
    "items",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentEncoding",
    "contentMediaType",
    "discriminator",
    "x-outboxkit-ce-type",
    "x-outboxkit-max-digits",
    "x-outboxkit-decimal-places",
]
#: Names of Event's attributes and methods that a field may shadow (with an alias if need be).
EVENT_ATTRIBUTES = sorted(
    name for name in dir(Event) if not name.startswith("__") and name not in ENVELOPE_FIELDS
)
NON_ASCII = ["größe", "名前", "ñame", "Ωmega", "cafe\u0301", "emoji😀", "naïve", "İd"]
WIRE_NAMES = sorted(
    {
        *_core_schema_keys(),
        *JSON_SCHEMA_KEYWORDS,
        *keyword.kwlist,
        *keyword.softkwlist,
        *EVENT_ATTRIBUTES,
        *NON_ASCII,
        "a",
        "with space",
        "dotted.name",
        "Mixed",
        "mixed",
    }
)


@cache
def plain_name_allowed(name: str) -> bool:
    """Whether ``name`` can be a field's Python name in an Event subclass (no alias needed)."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        return False
    if name in ENVELOPE_FIELDS or name.startswith("event_"):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            create_model(
                "Probe", __base__=Event, __cls_kwargs__={"type": "p", "topic": "t"}, **{name: int}
            )
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class TypeSpec:
    """An annotation and the strategy of its values."""

    annotation: Any
    values: st.SearchStrategy[Any]
    #: Representable by the Spark pipeline (spark_schema maps it).
    spark: bool = True

    def __repr__(self) -> str:
        return _show(self.annotation)


@dataclass(frozen=True)
class FieldSpec:
    wire: str
    python: str
    type: TypeSpec
    #: ``None``: required; else the default (a value of the type).
    default: Any = None
    has_default: bool = False


@dataclass(frozen=True)
class ModelSpec:
    fields: tuple[FieldSpec, ...]
    strict_reader: bool = False
    #: Nested models forbid unknown fields (strict readers reject them there too).
    nested: tuple[type[BaseModel], ...] = field(default=())

    @property
    def spark(self) -> bool:
        return all(f.type.spark for f in self.fields)


_counter = itertools.count()

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
naive_datetimes = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))
aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.just(UTC) | offsets,
)
texts = st.text(max_size=12)


def _decimal_spec(draw: st.DrawFn) -> TypeSpec:
    places = draw(st.none() | st.integers(min_value=0, max_value=6))
    digits = draw(st.none() | st.integers(min_value=max(places or 1, 1), max_value=18))
    lower = draw(st.none() | st.sampled_from([Decimal(0), Decimal("-100")]))
    constraints = {
        key: value
        for key, value in (("max_digits", digits), ("decimal_places", places), ("ge", lower))
        if value is not None
    }
    whole = None if digits is None else digits - (places or 0)
    top = None if whole is None else Decimal(10) ** whole - Decimal(10) ** -(places or 0)
    values = st.decimals(
        min_value=lower if lower is not None else (-top if top is not None else None),
        max_value=top,
        places=places,
        allow_nan=False,
        allow_infinity=False,
    )
    annotation = Annotated[Decimal, Field(**constraints)] if constraints else Decimal  # type: ignore[call-overload]
    if digits is not None:  # pydantic counts digits its own way (trailing zeros, exponents)
        adapter = TypeAdapter(annotation)
        values = values.filter(lambda d: _valid(adapter, d))
    return TypeSpec(annotation, values, spark=places is not None or digits is None)


def _valid(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value)
    except ValueError:
        return False
    return True


def _scalars(draw: st.DrawFn) -> TypeSpec:
    choice = draw(
        st.sampled_from(
            [
                "str",
                "str_bounded",
                "int",
                "int_bounded",
                "float",
                "bool",
                "decimal",
                "datetime_aware",
                "datetime_naive",
                "aware_only",
                "date",
                "uuid",
                "colour",
                "level",
                "literal_str",
                "literal_int",
            ]
        )
    )
    if choice == "str":
        return TypeSpec(str, texts)
    if choice == "str_bounded":
        return TypeSpec(
            Annotated[str, Field(min_length=1, max_length=8)], st.text(min_size=1, max_size=8)
        )
    if choice == "int":
        return TypeSpec(int, st.integers(min_value=-(2**63), max_value=2**63 - 1))
    if choice == "int_bounded":
        return TypeSpec(
            Annotated[int, Field(gt=-10, le=1000)], st.integers(min_value=-9, max_value=1000)
        )
    if choice == "float":
        return TypeSpec(float, finite_floats)
    if choice == "bool":
        return TypeSpec(bool, st.booleans())
    if choice == "decimal":
        return _decimal_spec(draw)
    if choice == "datetime_aware":
        return TypeSpec(datetime, aware_datetimes)
    if choice == "datetime_naive":
        return TypeSpec(datetime, naive_datetimes)
    if choice == "aware_only":
        return TypeSpec(AwareDatetime, aware_datetimes)
    if choice == "date":
        return TypeSpec(date, st.dates(min_value=date(1, 1, 2)))
    if choice == "uuid":
        return TypeSpec(UUID, st.uuids())
    if choice == "colour":
        return TypeSpec(Colour, st.sampled_from(Colour))
    if choice == "level":
        return TypeSpec(Level, st.sampled_from(Level))
    if choice == "literal_str":
        return TypeSpec(Literal["metadata", "type", "a b"], st.sampled_from(["metadata", "type"]))
    return TypeSpec(Literal[1, 2, 3], st.sampled_from([1, 2, 3]))


@st.composite
def types(draw: st.DrawFn, depth: int = 2, spark: bool = False) -> TypeSpec:
    """A field type: a scalar, or (``depth`` > 0) a container, a nested model or a union;
    ``spark``: only types the Spark pipeline maps."""
    kinds = ["scalar"] * 4 + (
        ["list", "tuple", "fixed_tuple", "dict", "model", "optional", "union"] if depth else []
    )
    if spark:
        kinds = [kind for kind in kinds if kind not in {"fixed_tuple", "union"}]
    kind = draw(st.sampled_from(kinds))
    if kind == "scalar":
        scalar = _scalars(draw)
        return scalar if scalar.spark or not spark else draw(types(depth=0, spark=spark))
    inner = draw(types(depth=depth - 1, spark=spark))
    if kind == "list":
        return TypeSpec(list[inner.annotation], st.lists(inner.values, max_size=3), inner.spark)
    if kind == "tuple":
        return TypeSpec(
            tuple[inner.annotation, ...],
            st.lists(inner.values, max_size=3).map(tuple),
            inner.spark,
        )
    if kind == "fixed_tuple":
        second = draw(types(depth=depth - 1, spark=spark))
        return TypeSpec(
            tuple[inner.annotation, second.annotation],
            st.tuples(inner.values, second.values),
            spark=False,
        )
    if kind == "dict":
        return TypeSpec(
            dict[str, inner.annotation],
            st.dictionaries(st.sampled_from(WIRE_NAMES) | texts, inner.values, max_size=3),
            inner.spark,
        )
    if kind == "optional":
        return TypeSpec(inner.annotation | None, st.none() | inner.values, inner.spark)
    if kind == "union":
        # Members a JSON value tells apart: a string and a list of ints, or an int and a bool.
        return draw(
            st.sampled_from(
                [
                    TypeSpec(str | list[int], texts | st.lists(st.integers(), max_size=2), False),
                    TypeSpec(int | bool, st.integers() | st.booleans(), False),
                    TypeSpec(UUID | int, st.uuids() | st.integers(), False),
                ]
            )
        )
    spec = draw(model_specs(depth=depth - 1, nested=True, spark=spark))
    nested = build_nested(spec)
    return TypeSpec(nested, values_of(spec, nested), spec.spark)


def _fields(draw: st.DrawFn, depth: int, spark: bool) -> tuple[FieldSpec, ...]:
    wires = draw(st.lists(st.sampled_from(WIRE_NAMES), min_size=1, max_size=6, unique=True))
    fields = []
    for index, wire in enumerate(wires):
        if wire in ENVELOPE_FIELDS:
            continue  # an envelope name is never a payload name (Event refuses it)
        spec = draw(types(depth=depth, spark=spark))
        python = wire if plain_name_allowed(wire) else f"f{index}_"
        defaulted = draw(st.booleans())
        default = draw(spec.values) if defaulted else None
        fields.append(FieldSpec(wire, python, spec, default, defaulted))
    return tuple(fields)


@st.composite
def model_specs(
    draw: st.DrawFn, depth: int = 2, nested: bool = False, spark: bool = False
) -> ModelSpec:
    return ModelSpec(
        _fields(draw, depth, spark), strict_reader=draw(st.booleans()) if not nested else False
    )


def _field_definitions(spec: ModelSpec) -> dict[str, Any]:
    definitions: dict[str, Any] = {}
    for f in spec.fields:
        info: dict[str, Any] = {}
        if f.python != f.wire:
            info["alias"] = f.wire
        if f.has_default:
            info["default"] = f.default
        definitions[f.python] = (f.type.annotation, Field(**info))
    return definitions


def build_nested(spec: ModelSpec) -> type[BaseModel]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a nested model's field may shadow a BaseModel method
        return create_model(  # type: ignore[no-any-return,call-overload]
            f"Nested{next(_counter)}",
            __config__=ConfigDict(extra="forbid", frozen=True, validate_by_name=True),
            **_field_definitions(spec),
        )


def build(spec: ModelSpec, *, version: int = 1, event_type: str | None = None) -> type[Event]:
    """The Event subclass of ``spec`` (a new type name unless ``event_type`` is given)."""
    name = f"Generated{next(_counter)}"
    return create_model(  # type: ignore[no-any-return,call-overload]
        name,
        __base__=Event,
        __cls_kwargs__={
            "type": event_type or f"test.generated.{name.lower()}",
            "version": version,
            "topic": "generated",
            "strict_reader": spec.strict_reader,
        },
        **_field_definitions(spec),
    )


def values_of(spec: ModelSpec, model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Instances of ``model`` (a nested one), built from values of each field's type."""
    required = {f.wire: f.type.values for f in spec.fields if not f.has_default}
    optional = {f.wire: f.type.values for f in spec.fields if f.has_default}
    return st.fixed_dictionaries(required, optional=optional).map(model.model_validate)


def events(spec: ModelSpec, model: type[Event]) -> st.SearchStrategy[Event]:
    """Instances of ``model``: payload values of each field's type, and an envelope."""
    required = {f.wire: f.type.values for f in spec.fields if not f.has_default}
    optional = {f.wire: f.type.values for f in spec.fields if f.has_default}
    return st.builds(
        lambda payload, key, when: model.model_validate(
            {**payload, "key": key, "occurred_at": when}
        ),
        st.fixed_dictionaries(required, optional=optional),
        st.text(min_size=1, max_size=8),
        aware_datetimes,
    )


def _show(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def property_settings(examples: int) -> settings:
    """The settings of a property over generated models: ``examples`` examples in CI (more with
    ``OUTBOXKIT_WHOLE_EXAMPLES``, a long run outside CI), no deadline, the failing example's
    blob printed for a replay."""
    return settings(
        max_examples=int(os.environ.get("OUTBOXKIT_WHOLE_EXAMPLES", str(examples))),
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
