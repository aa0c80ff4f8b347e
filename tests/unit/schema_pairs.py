"""Random pairs of event models, one a changed copy of the other, and what happens when each
side's records are decoded by the other side's registry (the property of
tests/unit/test_schema_compatibility.py).

A model is a few fields, each a leaf kind (below), a nested model or a list of nested models,
required or with a default. The new model is the old one after one to three changes: a field
added (required or not), removed, retyped (which widens, narrows or changes it, enum values
included), made optional or required, or a change inside a nested model. Each side writes
records that reach the edges of its types (every value of each leaf kind's catalog, one field
at a time), and the old side also writes records older than its optional fields (each left out,
and all of them): that is what a reader meets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Annotated, Any, Literal

from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, create_model

from outboxkit.schemas import Event, EventDecodeError, EventRegistry, encode

#: kind → (annotation, the values a writer of it writes: its first is its default).
LEAVES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "int": (int, (0, 7)),
    "int_or_none": (int | None, (0, None)),
    "float": (float, (1.5, 0.0)),
    "str": (str, ("x", "xxxxxx")),
    "short_str": (Annotated[str, Field(max_length=3)], ("x", "xyz")),
    "ab": (Literal["a", "b"], ("a", "b")),
    "abc": (Literal["a", "b", "c"], ("a", "b", "c")),
    "bc": (Literal["b", "c"], ("b", "c")),
}
NESTED = ("model", "models")
#: Kinds one widening or narrowing away (a retype picks one of these most of the time).
NEIGHBOURS = {
    "int": ("float", "int_or_none"),
    "int_or_none": ("int",),
    "float": ("int",),
    "str": ("short_str", "ab"),
    "short_str": ("str", "ab"),
    "ab": ("abc", "short_str", "str"),
    "abc": ("ab", "bc"),
    "bc": ("abc",),
}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str
    optional: bool
    #: The fields of a nested model (``model``, ``models``), and whether it forbids unknown ones.
    fields: tuple[FieldSpec, ...] = ()
    forbid: bool = False


@dataclass(frozen=True)
class ModelSpec:
    fields: tuple[FieldSpec, ...]
    strict_reader: bool = False


@dataclass
class SchemaPair:
    old_spec: ModelSpec
    new_spec: ModelSpec

    @cached_property
    def old(self) -> type[Event]:
        return _event(self.old_spec, "Old")

    @cached_property
    def new(self) -> type[Event]:
        return _event(self.new_spec, "New")

    def decoding(self) -> tuple[bool, bool]:
        """(every old record decodes with the new registry, every new one with the old)."""
        old_records = _records(self.old, self.old_spec, older=True)
        new_records = _records(self.new, self.new_spec, older=False)
        return _all_decode(self.new, old_records), _all_decode(self.old, new_records)


# -- building the models ---------------------------------------------------------------------


def event(
    fields: dict[str, Any],
    *,
    event_type: str = "shop.order_placed",
    version: int = 1,
    topic: str = "shop.orders",
    key_field: str | None = None,
    strict_reader: bool = False,
) -> type[Event]:
    """An event model; a field is its annotation (required) or (annotation, default)."""
    definitions = {
        name: spec if isinstance(spec, tuple) else (spec, ...) for name, spec in fields.items()
    }
    keywords: dict[str, Any] = {
        "type": event_type,
        "version": version,
        "topic": topic,
        "strict_reader": strict_reader,
    }
    if key_field is not None:
        keywords["key_field"] = key_field
    model: type[Event] = create_model(  # type: ignore[call-overload]
        "OrderPlaced", __base__=Event, __cls_kwargs__=keywords, **definitions
    )
    return model


def _annotation(spec: FieldSpec, prefix: str) -> Any:
    if spec.kind in LEAVES:
        return LEAVES[spec.kind][0]
    nested = _nested(spec, prefix)
    return nested if spec.kind == "model" else list[nested]  # type: ignore[valid-type]


def _nested(spec: FieldSpec, prefix: str) -> type[BaseModel]:
    name = f"{prefix}_{spec.name}"
    config = ConfigDict(extra="forbid") if spec.forbid else ConfigDict()
    fields = {f.name: _definition(f, name) for f in spec.fields}
    model: type[BaseModel] = create_model(name, __config__=config, **fields)  # type: ignore[call-overload]
    return model


def _definition(spec: FieldSpec, prefix: str) -> tuple[Any, Any]:
    annotation = _annotation(spec, prefix)
    if not spec.optional:
        return annotation, ...
    if spec.kind == "models":
        return annotation, Field(default_factory=list)
    if spec.kind == "model":
        default = annotation(**_base_value(spec))
        return annotation, Field(default_factory=default.model_copy)
    return annotation, LEAVES[spec.kind][1][0]


def _event(spec: ModelSpec, prefix: str) -> type[Event]:
    keywords: dict[str, Any] = {
        "type": "prop.changed",
        "version": 1,
        "topic": "prop.events",
        "strict_reader": spec.strict_reader,
    }
    fields = {f.name: _definition(f, prefix) for f in spec.fields}
    model: type[Event] = create_model(  # type: ignore[call-overload]
        prefix, __base__=Event, __cls_kwargs__=keywords, **fields
    )
    return model


# -- writing and reading records ---------------------------------------------------------------


def _base_value(spec: FieldSpec) -> Any:
    if spec.kind in LEAVES:
        return LEAVES[spec.kind][1][0]
    value = {f.name: _base_value(f) for f in spec.fields}
    return value if spec.kind == "model" else [value]


def _variations(spec: FieldSpec) -> list[Any]:
    """Values of the field that reach the edges of its type, one nested field at a time."""
    if spec.kind in LEAVES:
        return list(LEAVES[spec.kind][1])
    base = {f.name: _base_value(f) for f in spec.fields}
    values = [{**base, f.name: value} for f in spec.fields for value in _variations(f)] or [base]
    return values if spec.kind == "model" else [[value] for value in values]


def _payloads(spec: ModelSpec) -> list[dict[str, Any]]:
    base = {f.name: _base_value(f) for f in spec.fields}
    return [base] + [{**base, f.name: value} for f in spec.fields for value in _variations(f)]


def _without_optional(payload: Any, fields: tuple[FieldSpec, ...], path: str | None) -> Any:
    """``payload`` (JSON) without the optional field at ``path`` (``f0.f1``), or without every
    optional field at every level when ``path`` is ``None``."""
    if isinstance(payload, list):
        return [_without_optional(item, fields, path) for item in payload]
    head, _, rest = (path or "").partition(".")
    kept = dict(payload)
    for spec in fields:
        if spec.name not in kept:
            continue
        if (path is None and spec.optional) or (spec.name == head and not rest):
            del kept[spec.name]
        elif spec.kind in NESTED and (path is None or spec.name == head):
            kept[spec.name] = _without_optional(kept[spec.name], spec.fields, rest or None)
    return kept


def _optional_paths(fields: tuple[FieldSpec, ...], prefix: str = "") -> list[str]:
    paths = []
    for spec in fields:
        if spec.optional:
            paths.append(prefix + spec.name)
        if spec.kind in NESTED:
            paths += _optional_paths(spec.fields, f"{prefix}{spec.name}.")
    return paths


@dataclass(frozen=True)
class _Record:
    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def _records(model: type[Event], spec: ModelSpec, *, older: bool) -> list[_Record]:
    records = []
    for payload in _payloads(spec):
        encoded = encode(model(key="k", **payload), source="urn:test")
        records.append(_Record(encoded.topic, encoded.key, encoded.value, encoded.headers))
    if older:  # records written before each optional field existed
        first = records[0]
        written = json.loads(first.value)
        for only in [None, *_optional_paths(spec.fields)]:
            value = json.dumps(_without_optional(written, spec.fields, only)).encode()
            records.append(replace(first, value=value))
    return records


def _all_decode(reader: type[Event], records: list[_Record]) -> bool:
    registry = EventRegistry()
    registry.register(reader)
    try:
        for record in records:
            registry.decode(
                topic=record.topic, key=record.key, value=record.value, headers=record.headers
            )
    except EventDecodeError:
        return False
    return True


# -- the grammar of changes --------------------------------------------------------------------

_leaf_kinds = st.sampled_from(sorted(LEAVES))


@st.composite
def _field(draw: st.DrawFn, name: str, depth: int) -> FieldSpec:
    kinds = st.one_of(_leaf_kinds, st.sampled_from(NESTED)) if depth == 0 else _leaf_kinds
    kind = draw(kinds)
    fields: tuple[FieldSpec, ...] = ()
    if kind in NESTED:
        fields = draw(_fields(depth + 1, min_size=1))
    return FieldSpec(name, kind, draw(st.booleans()), fields, draw(st.booleans()))


@st.composite
def _fields(draw: st.DrawFn, depth: int, min_size: int = 0) -> tuple[FieldSpec, ...]:
    count = draw(st.integers(min_size, 3))
    return tuple(draw(_field(f"f{index}", depth)) for index in range(count))


@st.composite
def _changed(draw: st.DrawFn, fields: tuple[FieldSpec, ...], depth: int) -> tuple[FieldSpec, ...]:
    # (The first is what hypothesis draws most and shrinks to.)
    changes = (["retype", "nested", "toggle", "remove"] if fields else []) + ["add"]
    change = draw(st.sampled_from(changes))
    if change == "add":
        taken = {f.name for f in fields}
        name = next(f"f{i}" for i in range(len(taken) + 1) if f"f{i}" not in taken)
        return (*fields, draw(_field(name, depth)))
    index = draw(st.integers(0, len(fields) - 1))
    target = fields[index]
    if change == "remove":
        return fields[:index] + fields[index + 1 :]
    if change == "retype":
        others = _leaf_kinds.filter(lambda k: k != target.kind)
        near = NEIGHBOURS.get(target.kind, ())
        kind = draw(st.sampled_from(near) if near and draw(st.integers(0, 2)) else others)
        updated = replace(target, kind=kind, fields=())
    elif change == "toggle":
        updated = replace(target, optional=not target.optional)
    elif target.kind in NESTED:
        updated = replace(target, fields=draw(_changed(target.fields, depth + 1)))
    else:
        return fields
    return (*fields[:index], updated, *fields[index + 1 :])


@st.composite
def schema_pairs(draw: st.DrawFn) -> SchemaPair:
    old_fields = draw(_fields(0, min_size=1))
    new_fields = old_fields
    for _ in range(draw(st.integers(1, 3))):
        new_fields = draw(_changed(new_fields, 0))
    # Mostly tolerant readers (the default), a strict one now and then.
    stricts = st.sampled_from([False, False, False, True])
    return SchemaPair(
        ModelSpec(old_fields, draw(stricts)),
        ModelSpec(new_fields, draw(stricts)),
    )
