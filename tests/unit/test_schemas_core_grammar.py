"""The bounded validator walks pydantic-core's schemas by their grammar: user data (field
names, dict keys, tags, defaults) is never read as schema, and no rewrite can drop a field.

Each named case below failed before the grammar walk: the rewrite read every dict of the core
schema as a schema, dropped every key named ``metadata`` and read every key named ``type``."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, get_type_hints

import pydantic_core.core_schema as core
import pytest
import typing_extensions
from pydantic import BaseModel, Field

from outboxkit.schemas import (
    DecodeErrorReason,
    Event,
    EventDecodeError,
    EventRegistry,
    bounded,
    encode,
)
from outboxkit.schemas.bounded import bounded_validator
from outboxkit.schemas.core_grammar import GRAMMAR, NOT_VALIDATED, map_subschemas
from outboxkit.schemas.exceptions import SchemaError
from outboxkit.schemas.wire import build_event, read_envelope

# -- the grammar is pydantic-core's ------------------------------------------------------------


def _schema_typeddicts() -> dict[str, dict[str, Any]]:
    """Schema type → {key: annotation} for every schema pydantic-core defines (validators)."""
    schemas: dict[str, dict[str, Any]] = {}
    for name in dir(core):
        candidate = getattr(core, name)
        if not typing_extensions.is_typeddict(candidate) or not name.endswith("Schema"):
            continue
        if name.endswith("SerSchema") or name.startswith(("NoInfo", "WithInfo", "_")):
            continue  # serialisers, and the {type: no-info|with-info, function} of validators
        hints = get_type_hints(candidate)
        kind = hints.get("type")
        if typing.get_origin(kind) is not Literal:
            continue
        for literal in typing.get_args(kind):
            schemas.setdefault(literal, {}).update(hints)
    return schemas


def _holds_schema(annotation: Any) -> bool:
    """Whether an annotation holds core schemas: the ``CoreSchema`` union (of which
    ``AnySchema`` is one), or fields and parameters (each with its ``schema``)."""
    text = repr(annotation)
    return any(mark in text for mark in ("AnySchema", "Field]", "Parameter]"))


def test_the_grammar_knows_every_schema_type_of_pydantic_core() -> None:
    assert set(_schema_typeddicts()) == set(GRAMMAR)


@pytest.mark.parametrize("kind", sorted(_schema_typeddicts()))
def test_the_grammar_names_every_key_that_holds_a_schema(kind: str) -> None:
    hints = _schema_typeddicts()[kind]
    holding = {key for key, annotation in hints.items() if _holds_schema(annotation)}
    assert holding - NOT_VALIDATED == set(GRAMMAR[kind]), kind


def test_an_unknown_schema_type_is_refused() -> None:
    with pytest.raises(SchemaError, match="unknown type 'new-kind'"):
        map_subschemas({"type": "new-kind", "schema": {"type": "int"}}, lambda sub: sub)


def test_mapping_copies_every_key_and_rewrites_only_sub_schemas() -> None:
    seen: list[dict[str, Any]] = []

    def rewrite(sub: dict[str, Any]) -> dict[str, Any]:
        seen.append(sub)
        return {**sub, "seen": True}

    node = {
        "type": "model-fields",
        "fields": {
            "metadata": {"type": "model-field", "schema": {"type": "int"}, "metadata": {}},
            "type": {"type": "model-field", "schema": {"type": "str"}},
        },
        "metadata": {"type": "list"},
        "model_name": "M",
    }
    copy = map_subschemas(node, rewrite)
    assert set(copy) == set(node)
    assert set(copy["fields"]) == {"metadata", "type"}
    assert copy["metadata"] is node["metadata"]
    assert seen == [{"type": "int"}, {"type": "str"}]


# -- user data that looked like schema ------------------------------------------------------------


class Probe(Event, type="test.probe.metadata", topic="probe", key_field="k"):
    k: str
    metadata: dict[str, str]


class TypeNamed(Event, type="test.probe.type", topic="probe", key_field="k"):
    k: str
    type: str
    fields: list[int] = Field(default_factory=list)


class Plain(BaseModel):
    kind: Literal["plain"]
    x: int


class Meta(BaseModel):
    kind: Literal["metadata"]
    y: int


class Tagged(Event, type="test.probe.tagged", topic="probe", key_field="k"):
    k: str
    item: Annotated[Plain | Meta, Field(discriminator="kind")]


class Defaulted(Event, type="test.probe.defaulted", topic="probe", key_field="k"):
    k: str
    options: dict[str, str] = Field(default_factory=lambda: {"type": "list", "metadata": "m"})
    frozen_options: dict[str, str] = Field(
        default={"type": "model-fields", "extra_behavior": "forbid"}
    )


REGISTRY = EventRegistry()
for _model in (Probe, TypeNamed, Tagged, Defaulted):
    REGISTRY.register(_model)


def _round_trip(event: Event, *, value: bytes | None = None) -> Event:
    wire = encode(event, source="urn:test")
    return REGISTRY.decode(
        topic=wire.topic,
        key=wire.key,
        value=wire.value if value is None else value,
        headers=wire.headers,
    )


def test_a_field_named_metadata_is_decoded() -> None:
    event = Probe(k="1", metadata={"a": "b"})
    assert _round_trip(event) == event


def test_a_field_named_type_keeps_the_reader_tolerant_and_bounded() -> None:
    """The rewrite read the field map's ``type`` key as a schema type and gave up: the model's
    own validator then rejected every unknown field (a tolerant reader turned strict)."""
    event = TypeNamed(k="1", type="t", fields=[1])
    wire = encode(event, source="urn:test")
    newer = wire.value[:-1] + b',"added_later":1}'
    assert _round_trip(event, value=newer) == event
    assert bounded_validator(TypeNamed) is not TypeNamed.__pydantic_validator__


def test_a_discriminator_tag_named_metadata_is_a_choice() -> None:
    event = Tagged(k="1", item=Meta(kind="metadata", y=2))
    assert _round_trip(event) == event


def test_a_default_that_looks_like_a_schema_stays_as_declared() -> None:
    """A record older than the field gets the declared default, not one with ``fail_fast``."""
    older = b'{"k":"1"}'
    decoded = _round_trip(Defaulted(k="1"), value=older)
    assert decoded.options == {"type": "list", "metadata": "m"}  # type: ignore[attr-defined]
    assert decoded.frozen_options == {  # type: ignore[attr-defined]
        "type": "model-fields",
        "extra_behavior": "forbid",
    }


# -- fail closed ----------------------------------------------------------------------------------


def test_a_rewrite_that_loses_a_field_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bounded.map_subschemas

    def losing(schema: dict[str, Any], rewrite: Any) -> dict[str, Any]:
        copy = real(schema, rewrite)
        if copy["type"] == "model-fields":
            copy["fields"] = {k: v for k, v in copy["fields"].items() if k != "metadata"}
        return copy

    monkeypatch.setattr(bounded, "map_subschemas", losing)
    validator = bounded_validator(Probe)
    assert validator is Probe.__pydantic_validator__  # the model's own, which keeps every field


def test_an_event_decoded_without_a_declared_field_is_an_error() -> None:
    wire = encode(Probe(k="1", metadata={}), source="urn:test")
    lossy = Probe.__pydantic_validator__.__class__(
        {
            "type": "model",
            "cls": Probe,
            "schema": {
                "type": "model-fields",
                "fields": {
                    name: {"type": "model-field", "schema": {"type": "any"}}
                    for name in Probe.model_fields
                    if name != "metadata"
                },
            },
        }
    )
    with pytest.raises(EventDecodeError, match="decoded without the field") as caught:
        build_event(
            Probe,
            read_envelope(wire.headers),
            topic=wire.topic,
            key=wire.key,
            value=wire.value,
            validator=lossy,
        )
    assert caught.value.reason is DecodeErrorReason.INVALID_PAYLOAD
    assert "metadata" in str(caught.value)
