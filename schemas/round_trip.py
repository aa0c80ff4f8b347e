"""Which events are known to read back as themselves, without reading them back.

The strict writer (:mod:`outboxkit.schemas.encoding`) reads every record back the way a reader
does and compares: one validation of the whole event, most of what :func:`encode` costs. For
most models the answer follows from the field types alone. A ``str``, an ``int``, a ``bool``, a
finite ``float`` or ``Decimal``, a ``UUID``, a ``date``, a naive or UTC ``datetime``, ``bytes``, and
optionals, lists, ``str``-keyed dicts and plain nested models of them, written as JSON by
pydantic and validated by the same class, come back equal — *if each value is of its declared
type*. Constructing a model checks that, but ``model_construct``, ``model_copy(update=…)`` and a
list changed in place do not. So :func:`plain_check` gives, per class, a check of the exact type
of every value (and that numbers are finite and within what a reader parses), which costs a
fraction of the validation; an event that passes it is written without the read-back, any
other goes through the read-back, which decides.

A class gets a check only when its core schema (what pydantic runs, not what its annotations say)
is made of the shapes above and nothing else: a validator or serialiser of its own, an alias, an
excluded field, a constraint, a computed field, a private attribute, a ``model_dump_json`` of its
own, a changed setting (``str_strip_whitespace``, ``strict``…), a union, an enum, a recursive model
— any of them, at any depth, and every event of the class is read back. The allow-list is
deliberately short: what is not on it costs a validation, never a wrong record.

``tests/unit/test_schemas_round_trip.py`` holds the check to the read-back: whatever it passes,
the read-back accepts (generated models and values, and values put around validation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID
from weakref import WeakKeyDictionary

from pydantic import BaseModel

from outboxkit.schemas.event import ENVELOPE_FIELDS, Event, is_reserved_header, is_valid_topic

#: Whether a value is known to read back as itself.
Check = Callable[[Any], bool]

#: Ints a reader parses (JSON integers of more than 4,300 digits are refused as out of range;
#: this bound is far below, and a larger int is simply read back).
_INT_BOUND = 2**63
#: JSON nesting a plain model may reach (a reader refuses a document nested much deeper, ~200).
_MAX_DEPTH = 32
#: Keys a schema node may carry besides the ones its shape reads: documentation only.
_DOCUMENTATION = frozenset({"metadata", "ref"})


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a value must be to read back as itself: exactly of type ``kind`` (``None``: of no
    single type, an optional), and then pass ``more`` (``None``: nothing more)."""

    kind: type | None
    more: Check | None = None

    def check(self) -> Check:
        kind, more = self.kind, self.more
        if kind is None:
            assert more is not None
            return more
        if more is None:
            return lambda value: type(value) is kind
        return lambda value: type(value) is kind and more(value)


def _bounded(value: int) -> bool:
    return -_INT_BOUND < value < _INT_BOUND


#: Scalar schemas with no other key (as pydantic builds them for an unconstrained annotation).
_SCALARS: dict[str, _Shape] = {
    "str": _Shape(str),
    "int": _Shape(int, _bounded),
    "bool": _Shape(bool),
    "float": _Shape(float, math.isfinite),
    "decimal": _Shape(Decimal, Decimal.is_finite),
    "uuid": _Shape(UUID),
    "date": _Shape(date),
    # Written as its UTF-8 text (bytes that are not UTF-8 are refused as they are written, before
    # any check), read back as that text encoded.
    "bytes": _Shape(bytes),
}
#: A datetime schema's ``tz_constraint`` → what its values may be: naive or UTC (written as
#: they are; another offset, or a zone, is read back as a fixed offset, and is read back here).
_DATETIMES: dict[Any, _Shape] = {
    None: _Shape(datetime, lambda value: value.tzinfo is None or value.tzinfo is UTC),
    "naive": _Shape(datetime, lambda value: value.tzinfo is None),
    "aware": _Shape(datetime, lambda value: value.tzinfo is UTC),
}


class _Walk:
    """One class's schema walked once: named definitions, and the models being walked (a model
    met again inside itself is recursive, which has no check)."""

    def __init__(self, definitions: dict[str, dict[str, Any]]) -> None:
        self.definitions = definitions
        self.open: set[str] = set()

    def value(self, node: dict[str, Any], depth: int) -> _Shape | None:
        """The shape of values validated by ``node``, or ``None`` if it has none."""
        if depth > _MAX_DEPTH:
            return None
        kind = node.get("type")
        keys = node.keys() - _DOCUMENTATION - {"type"}
        if kind in _SCALARS:
            return None if keys else _SCALARS[kind]
        if kind == "datetime":
            if node.get("microseconds_precision", "truncate") != "truncate" or keys - {
                "microseconds_precision",
                "tz_constraint",
            }:
                return None
            return _DATETIMES.get(node.get("tz_constraint"))
        if kind == "nullable" and keys == {"schema"}:
            return _nullable(self.value(node["schema"], depth))
        if kind == "default" and keys - {"default_factory_takes_data"} in (
            {"schema", "default"},
            {"schema", "default_factory"},
        ):
            return self.value(node["schema"], depth)  # the value is written, never the default
        if kind == "list" and keys == {"items_schema"}:
            return _list(self.value(node["items_schema"], depth + 1))
        if kind == "dict" and keys == {"keys_schema", "values_schema"}:
            if node["keys_schema"] != {"type": "str"}:
                return None  # an int key is read back as a str (and 1 and "1" collide)
            return _dict(self.value(node["values_schema"], depth + 1))
        if kind == "definition-ref" and keys == {"schema_ref"}:
            ref = node["schema_ref"]
            if ref in self.open or ref not in self.definitions:
                return None
            return self.value(self.definitions[ref], depth)
        if kind == "model":
            return self.model(node, depth + 1)
        return None

    def model(self, node: dict[str, Any], depth: int) -> _Shape | None:
        """A plain nested model: no validator, serialiser, setting or extra of its own."""
        cls = node["cls"]
        config = _config(node)
        if (
            not _plain_model_node(node)
            or config.keys() - {"extra_fields_behavior"}
            or config.get("extra_fields_behavior", "ignore") not in ("ignore", "forbid")
        ):
            return None
        ref = node.get("ref")
        if ref is not None:
            self.open.add(ref)
        try:
            fields = self.fields(node["schema"], depth, skip=frozenset())
        finally:
            self.open.discard(ref)
        if fields is None:
            return None
        whole = _fields_check(fields)
        return _Shape(
            cls,
            lambda value: (
                not value.__pydantic_extra__
                and not value.__pydantic_private__
                and whole(value.__dict__)
            ),
        )

    def fields(
        self, node: dict[str, Any], depth: int, *, skip: frozenset[str]
    ) -> list[tuple[str, _Shape]] | None:
        """Each field's shape (but ``skip``'s): written under its own name, not excluded."""
        if (
            node.get("type") != "model-fields"
            or node.get("computed_fields")
            or (node.keys() - _DOCUMENTATION - {"type", "fields", "model_name", "computed_fields"})
        ):
            return None
        shapes = []
        for name, field in node["fields"].items():
            if name in skip:
                continue
            if field.get("type") != "model-field" or (
                field.keys() - _DOCUMENTATION - {"type", "schema", "frozen"}
            ):
                return None  # an alias, an exclusion, a field serialiser's key…
            shape = self.value(field["schema"], depth)
            if shape is None:
                return None
            shapes.append((name, shape))
        return shapes


def _nullable(shape: _Shape | None) -> _Shape | None:
    if shape is None:
        return None
    check = shape.check()
    return _Shape(None, lambda value: value is None or check(value))


def _each(shape: _Shape) -> Callable[[Any], bool]:
    """Whether every item of an iterable has ``shape``."""
    kind, more = shape.kind, shape.more
    if kind is not None and more is None:
        kinds = frozenset({kind})
        return lambda items: set(map(type, items)) <= kinds
    check = shape.check()
    return lambda items: all(map(check, items))


def _list(shape: _Shape | None) -> _Shape | None:
    return None if shape is None else _Shape(list, _each(shape))


def _dict(shape: _Shape | None) -> _Shape | None:
    if shape is None:
        return None
    values = _each(shape)
    # A key pydantic writes as it is, but a lone surrogate it replaces (a value's it refuses).
    return _Shape(dict, lambda value: all(map(_text, value)) and values(value.values()))


def _fields_check(fields: list[tuple[str, _Shape]]) -> Callable[[dict[str, Any]], bool]:
    """Whether a model's ``__dict__`` holds every field in its shape. Raises ``KeyError`` for a
    field missing."""
    plan = [(name, shape.kind, shape.more) for name, shape in fields]

    def whole(values: dict[str, Any]) -> bool:
        for name, kind, more in plan:
            value = values[name]
            if (kind is not None and type(value) is not kind) or (
                more is not None and not more(value)
            ):
                return False
        return True

    return whole


def _plain_model_node(node: dict[str, Any]) -> bool:
    """A model schema with no code of its own (``__init__``, ``model_post_init``, a root
    model), no private attributes (readers give their defaults) and no generic parameters."""
    cls = node["cls"]
    return (
        node.keys() - _DOCUMENTATION
        == {"type", "cls", "schema", "config", "custom_init", "root_model"}
        and not node["custom_init"]
        and not node["root_model"]
        and not cls.__private_attributes__
        and not cls.__pydantic_generic_metadata__["origin"]
    )


#: Settings that change nothing of a model without aliases (a field with one has no check).
_HARMLESS_SETTINGS = frozenset(
    {"title", "validate_by_name", "validate_by_alias", "populate_by_name", "serialize_by_alias"}
)


def _config(model: dict[str, Any]) -> dict[str, Any]:
    """A model schema's settings that could change how its values are written or read."""
    return {
        key: value
        for key, value in model.get("config", {}).items()
        if key not in _HARMLESS_SETTINGS
    }


def _decorators(cls: type[BaseModel]) -> dict[str, dict[str, Any]]:
    infos = cls.__pydantic_decorators__
    return {
        kind: {
            # A classmethod's function is bound to each subclass: compare what it binds.
            name: getattr(decorator.func, "__func__", decorator.func)
            for name, decorator in getattr(infos, kind).items()
        }
        for kind in (
            "validators",
            "field_validators",
            "root_validators",
            "field_serializers",
            "model_serializers",
            "model_validators",
            "computed_fields",
        )
    }


def _text(value: Any) -> bool:
    """A str written as it is (no lone surrogate)."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _headers(value: dict[Any, Any]) -> bool:
    return all(
        _text(name) and _text(text) and not is_reserved_header(name) for name, text in value.items()
    )


#: The envelope as encode writes it and a reader validates it: a UUID, a non-empty key, a
#: topic Kafka accepts, a UTC time (what the model's own validator makes of any), headers.
_ENVELOPE = [
    ("id", _Shape(UUID)),
    ("key", _Shape(str, lambda value: value != "" and _text(value))),
    ("topic", _Shape(str, is_valid_topic)),
    ("occurred_at", _Shape(datetime, lambda value: value.tzinfo is UTC)),
    ("headers", _Shape(dict, _headers)),
]


def _event_plan(cls: type[Event]) -> Callable[[Event], bool] | None:
    """The check of ``cls``'s events, or ``None`` when they must be read back."""
    schema: dict[str, Any] = cls.__pydantic_core_schema__  # type: ignore[assignment]
    definitions: dict[str, dict[str, Any]] = {}
    if schema.get("type") == "definitions":
        definitions = {d["ref"]: d for d in schema["definitions"] if "ref" in d}
        schema = schema["schema"]
    # Event's own model validator around the model, and nothing else: a model validator of the
    # subclass adds a layer, a field validator of an envelope field a decorator.
    if (
        schema.get("type") != "function-after"
        or schema.get("function", {}).get("function") is not Event._fill_topic_and_key
        or _decorators(cls) != _EVENT_DECORATORS
        # encode writes what model_dump_json returns: a method of its own writes anything.
        or cls.model_dump_json is not BaseModel.model_dump_json
    ):
        return None
    model = schema["schema"]
    if (
        model.get("type") != "model"
        or model.get("cls") is not cls
        or not _plain_model_node(model)
        or _config(model) != _EVENT_CONFIG
    ):
        return None
    payload = _Walk(definitions).fields(model["schema"], 1, skip=ENVELOPE_FIELDS)
    if payload is None:
        return None
    fields = _fields_check(_ENVELOPE + payload)

    def whole(event: Event) -> bool:
        if event.__pydantic_extra__ or event.__pydantic_private__:
            return False
        try:
            return fields(event.__dict__)
        except KeyError:  # a field missing (model_construct): the read-back says what is wrong
            return False

    return whole


_EVENT_DECORATORS = _decorators(Event)
_EVENT_CONFIG = _config(Event.__pydantic_core_schema__["schema"])

_PLANS: WeakKeyDictionary[type[Event], Callable[[Event], bool] | None] = WeakKeyDictionary()


def plain_check(cls: type[Event]) -> Callable[[Event], bool] | None:
    """A check that says, for an event of ``cls``, whether it is known to read back as itself
    (its values all of the plain kinds the module lists); ``None`` when ``cls``' schema holds
    anything else, and every event of it must be read back. Decided once per class."""
    try:
        return _PLANS[cls]
    except KeyError:
        plan = _PLANS[cls] = _event_plan(cls)
        return plan
