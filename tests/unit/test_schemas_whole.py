"""Every event arrives whole (G11): over generated models (tests/event_models.py: field names
that are pydantic-core and JSON Schema keywords, Python keywords, non-ASCII, Event attributes;
every supported type, nested, optional, defaulted, unions), what the writer accepts every
reader decodes to an equal event, with every field set: the registry, a strict reader, and a
newer version read through an upcaster. What the writer refuses, a reader would indeed refuse
or read differently.

Hypothesis prints the falsifying example and ``@reproduce_failure`` on a failure
(``print_blob``); ``OUTBOXKIT_WHOLE_EXAMPLES`` runs more examples (a long run outside CI)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import event as note
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from outboxkit.schemas import Event, EventRegistry, SchemaError, encode
from tests.event_models import FieldSpec, ModelSpec, build, events, model_specs, property_settings

PROPERTY = property_settings(200)


def assert_whole(decoded: BaseModel, written: BaseModel, path: str = "") -> None:
    """Equal, and every field set (present on the wire, not defaulted), at every level."""
    assert type(decoded) is type(written), path
    assert decoded == written, path
    declared = set(type(decoded).model_fields)
    assert set(decoded.__dict__) == declared, f"{path}: fields missing"
    assert decoded.model_fields_set >= declared - {"id", "key", "topic", "occurred_at", "headers"}
    for name in declared:
        _assert_nested_whole(getattr(decoded, name), getattr(written, name), f"{path}.{name}")


def _assert_nested_whole(decoded: Any, written: Any, path: str) -> None:
    if isinstance(decoded, BaseModel):
        assert_whole(decoded, written, path)
    elif isinstance(decoded, list | tuple):
        for index, (d, w) in enumerate(zip(decoded, written, strict=True)):
            _assert_nested_whole(d, w, f"{path}[{index}]")
    elif isinstance(decoded, dict):
        for key, value in decoded.items():
            _assert_nested_whole(value, written[key], f"{path}{{{key}}}")


def _decode(registry: EventRegistry, event: Event) -> Event | None:
    """The registry's event from ``event``'s record, or ``None`` when the writer refused it
    (and then a reader indeed refuses or changes the unchecked record)."""
    try:
        wire = encode(event, source="urn:test")
    except SchemaError as exc:
        note(f"written: refused ({str(exc).split(': ', 1)[1][:60]})")
        _assert_readers_refuse(event)
        return None
    note("written: accepted")
    return registry.decode(topic=wire.topic, key=wire.key, value=wire.value, headers=wire.headers)


def _assert_readers_refuse(event: Event) -> None:
    """The writer refused ``event``: pydantic's own validator of the model (not outboxkit's,
    which the writer itself reads back with) must refuse its record too, or read another
    event."""
    try:
        payload = event.model_dump(
            mode="json", include=set(event.event_payload_fields), by_alias=True
        )
    except ValueError:
        return  # not even writable as JSON
    envelope = event.model_dump(
        mode="json", include={"id", "key", "topic", "occurred_at", "headers"}
    )
    try:
        again = type(event).model_validate_json(json.dumps({**payload, **envelope}))
    except ValueError:
        return
    assert again != event, "the writer refused an event that pydantic reads back equal"


@st.composite
def model_and_event(draw: st.DrawFn, strict: bool | None = None) -> tuple[ModelSpec, Event]:
    spec = draw(model_specs())
    if strict is not None:
        spec = ModelSpec(spec.fields, strict_reader=strict)
    model = build(spec)
    return spec, draw(events(spec, model))


@PROPERTY
@given(model_and_event())
def test_the_registry_decodes_what_the_writer_wrote(drawn: tuple[ModelSpec, Event]) -> None:
    _, event = drawn
    registry = EventRegistry()
    registry.register(type(event))
    decoded = _decode(registry, event)
    if decoded is not None:
        assert_whole(decoded, event)


@PROPERTY
@given(model_and_event(strict=True))
def test_a_strict_reader_decodes_what_the_writer_wrote(drawn: tuple[ModelSpec, Event]) -> None:
    _, event = drawn
    assert type(event).event_strict_reader
    registry = EventRegistry()
    registry.register(type(event))
    decoded = _decode(registry, event)
    if decoded is not None:
        assert_whole(decoded, event)


@PROPERTY
@given(model_and_event(), st.data())
def test_an_upcast_version_decodes_whole(
    drawn: tuple[ModelSpec, Event], data: st.DataObject
) -> None:
    """v1's fields, and v2 = v1 + one added field that an upcaster fills in: a v1 record is
    read as the v2 event made of the same values."""
    spec, v1 = drawn
    added = FieldSpec("added_in_v2", "added_in_v2", spec.fields[0].type)
    v2_spec = ModelSpec((*spec.fields, added), strict_reader=spec.strict_reader)
    v2 = build(v2_spec, version=2, event_type=type(v1).event_type)
    filler = data.draw(added.type.values)
    filled = v2.model_validate({**v1.model_dump(by_alias=True), "added_in_v2": filler})
    registry = EventRegistry()
    registry.register(v2)

    @registry.upcaster(v2, from_version=1)
    def _fill(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "added_in_v2": filled.model_dump(mode="json")["added_in_v2"]}

    try:
        encode(filled, source="urn:test")
    except SchemaError:
        return  # the filler itself cannot be written (the registry property covers it)
    decoded = _decode(registry, v1)
    if decoded is not None:
        assert_whole(decoded, filled)
