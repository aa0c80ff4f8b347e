"""Which keys of a pydantic-core schema hold the schemas that validate: its grammar.

A core schema (``Model.__pydantic_core_schema__``) is a tree of dicts, but not every dict in
it is a schema, and not every key names schema: a model's ``fields`` maps the user's field
names to fields, a tagged union's ``choices`` maps tag values to schemas, a ``default`` or a
``literal``'s ``expected`` holds the user's values. A rewrite that looks at every dict and
reads its ``type`` or ``metadata`` key mistakes that data for schema (a field named
``metadata`` dropped, a field named ``type`` read as a schema's type, a default
``{"type": "list"}`` given ``fail_fast``). :func:`map_subschemas` goes only where
:data:`GRAMMAR` says a schema of that type keeps its sub-schemas, so data is never visited.

:data:`GRAMMAR` lists the keys that matter for *validation*; :data:`NOT_VALIDATED` the keys
that hold schemas of other jobs (serialisation, JSON Schema), which are copied as they are.
``tests/unit/test_schemas_core_grammar.py`` holds both to pydantic-core's own definitions
(``pydantic_core.core_schema``), so that a release adding a key fails a test, not a decode.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from outboxkit.schemas.exceptions import SchemaError


class Slot(Enum):
    """How a key of a schema holds its sub-schemas."""

    #: One schema.
    ONE = "one"
    #: A list of schemas.
    MANY = "many"
    #: A union's choices: each a schema or ``(schema, label)``.
    CHOICES = "choices"
    #: A tagged union's choices: ``{tag: schema}`` (the tags are the user's values).
    TAGGED = "tagged"
    #: ``{field name: field}`` (the names are the user's); each field's ``schema``.
    FIELD_MAP = "field_map"
    #: ``[field]`` or ``[parameter]``: each one's ``schema``.
    FIELD_LIST = "field_list"


_ONE, _MANY = Slot.ONE, Slot.MANY
_ITEMS = {"items_schema": _ONE}
_MAPPING = {"keys_schema": _ONE, "values_schema": _ONE}
_WRAPPED = {"schema": _ONE}

#: Schema type → {key: how it holds sub-schemas}, for every key whose schemas validate.
#: A type without sub-schemas maps to ``{}``; a type missing here is unknown.
GRAMMAR: dict[str, dict[str, Slot]] = {
    **{
        kind: {}
        for kind in (
            "invalid",
            "any",
            "none",
            "bool",
            "int",
            "float",
            "decimal",
            "fraction",
            "str",
            "bytes",
            "date",
            "time",
            "datetime",
            "timedelta",
            "literal",
            "ellipsis",
            "enum",
            "is-instance",
            "is-subclass",
            "callable",
            "url",
            "multi-host-url",
            "definition-ref",
            "uuid",
            "complex",
            "function-plain",
        )
    },
    **dict.fromkeys(("list", "deque", "set", "frozenset", "generator"), _ITEMS),
    "tuple": {"items_schema": _MANY},
    **dict.fromkeys(("dict", "frozendict", "ordered-dict", "counter"), _MAPPING),
    **dict.fromkeys(
        (
            "function-after",
            "function-before",
            "function-wrap",
            "default",
            "nullable",
            "custom-error",
            "json",
            "missing-sentinel",
            "model",
            "dataclass",
        ),
        _WRAPPED,
    ),
    "union": {"choices": Slot.CHOICES},
    "tagged-union": {"choices": Slot.TAGGED},
    "chain": {"steps": _MANY},
    "lax-or-strict": {"lax_schema": _ONE, "strict_schema": _ONE},
    "json-or-python": {"json_schema": _ONE, "python_schema": _ONE},
    "typed-dict": {"fields": Slot.FIELD_MAP, "extras_schema": _ONE},
    "model-fields": {
        "fields": Slot.FIELD_MAP,
        "extras_schema": _ONE,
        "extras_keys_schema": _ONE,
    },
    "dataclass-args": {"fields": Slot.FIELD_LIST},
    "named-tuple": {"fields": Slot.FIELD_LIST},
    "arguments": {
        "arguments_schema": Slot.FIELD_LIST,
        "var_args_schema": _ONE,
        "var_kwargs_schema": _ONE,
    },
    "arguments-v3": {"arguments_schema": Slot.FIELD_LIST},
    "call": {"arguments_schema": _ONE, "return_schema": _ONE},
    "definitions": {"schema": _ONE, "definitions": _MANY},
}

#: Keys that hold schemas which do not validate: serialisation, JSON Schema generation, and
#: the return types of computed fields (serialised only). Copied as they are.
NOT_VALIDATED = frozenset(
    {"serialization", "json_schema_input_schema", "computed_fields", "metadata"}
)

Rewrite = Callable[[dict[str, Any]], dict[str, Any]]


def map_subschemas(schema: dict[str, Any], rewrite: Rewrite) -> dict[str, Any]:
    """A shallow copy of ``schema`` whose sub-schemas (by :data:`GRAMMAR`, one level down) are
    replaced by ``rewrite(sub_schema)``; every other key and value is kept as it is.

    Raises :class:`SchemaError` for a schema type the grammar does not know."""
    kind = schema.get("type")
    slots = GRAMMAR.get(kind) if isinstance(kind, str) else None
    if slots is None:
        raise SchemaError(f"a core schema of unknown type {kind!r}")
    copy = dict(schema)
    for key, slot in slots.items():
        if key in schema:
            copy[key] = _map_slot(slot, schema[key], rewrite)
    return copy


def _map_slot(slot: Slot, value: Any, rewrite: Rewrite) -> Any:
    if slot is Slot.ONE:
        return rewrite(value)
    if slot is Slot.MANY:
        return [rewrite(item) for item in value]
    if slot is Slot.CHOICES:
        return [
            (rewrite(choice[0]), *choice[1:]) if isinstance(choice, tuple) else rewrite(choice)
            for choice in value
        ]
    if slot is Slot.TAGGED:
        return {tag: rewrite(choice) for tag, choice in value.items()}
    if slot is Slot.FIELD_MAP:
        return {name: _field(field, rewrite) for name, field in value.items()}
    return [_field(field, rewrite) for field in value]


def _field(field: dict[str, Any], rewrite: Rewrite) -> dict[str, Any]:
    """A field or parameter (``model-field``, ``typed-dict-field``…) with its schema rewritten."""
    return {**field, "schema": rewrite(field["schema"])}
