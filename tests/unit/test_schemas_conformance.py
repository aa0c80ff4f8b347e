"""The exported schema and outboxkit's reader give the same verdict (docs/schemas.md, "What the
schema and the reader disagree on"): over generated models (tests/event_models.py), every record
the writer produces validates against its model's exported schema (``jsonschema``, draft
2020-12, formats asserted), and on payloads near a valid one — a value of another JSON type, a
value out of its range, a string in a bad format, a required field missing, a field added, at
any depth — the schema accepts exactly what the reader accepts, except:

- a lax form the reader coerces (``"12"`` for an int…): the reader accepts, the schema refuses,
  and the event it reads is written back in another form than the one given;
- what standard JSON Schema cannot say, listed in the docs: a Decimal's bounds on its string
  form, the digits of its exponent form and of its number form (the writer writes strings), a
  calendar day that does not exist, an int written as a float past 64 bits (``1e20``: an
  integer to JSON Schema, whatever its notation).

Hypothesis prints the falsifying example on a failure (``print_blob``); ``OUTBOXKIT_WHOLE_EXAMPLES``
runs more examples (a long run outside CI)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from hypothesis import event as note
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import ValidationError

from outboxkit.schemas import Event, EventDecodeError, EventRegistry, SchemaError, encode
from outboxkit.schemas.compat.snapshot import payload_schema
from tests.event_models import ModelSpec, build, events, model_specs, property_settings

PROPERTY = property_settings(100)
SOURCE = "urn:test:conformance"

#: Values of each JSON type, to put where another type stands.
OTHER_TYPES: list[Any] = [None, True, False, 0, -7, 1.5, "x", "", [], {}, [1], {"a": 1}]
#: Strings near the forms the writer writes: numbers, decimals, dates, times, UUIDs.
NEAR_FORMATS = [
    "12",
    "-1",
    "-1.00",
    "0.001",
    "19.805",
    "1E+30",
    "1e3",
    ".5",
    "+1",
    "1_000",
    " 1",
    "NaN",
    "Infinity",
    "twelve",
    "2024-05-01",
    "2024-13-01",
    "2024-02-30",
    "2024-05-01T12:00:00",
    "2024-05-01T12:00:00Z",
    "2024-05-01T12:00:00+02:00",
    "2024-05-01 12:00",
    "2024-02-30T12:00:00",
    "2024-05-01T25:00:00Z",
    "1714564800",
    "00000000-0000-0000-0000-000000000007",
    "00000000000000000000000000000007",
    "00000000-0000-0000-0000-00000000000g",
    "red",
    "metadata",
    "true",
    "a" * 9,
]
BIG_NUMBERS = [2**63, -(2**63) - 1, 10**30, -1000, 1001, -10, 1e308, -1.5]


def _validator(model: type[Event]) -> Draft202012Validator:
    return Draft202012Validator(payload_schema(model), format_checker=FormatChecker())


def _written(event: Event) -> Any:
    try:
        return encode(event, source=SOURCE)
    except SchemaError:
        return None  # the writer refuses it (tests/unit/test_schemas_whole.py says why)


@PROPERTY
@given(st.data())
def test_every_record_the_writer_produces_validates_against_its_schema(data: st.DataObject) -> None:
    spec = data.draw(model_specs())
    model = build(spec)
    validator = _validator(model)
    for event in data.draw(st.lists(events(spec, model), min_size=1, max_size=3)):
        wire = _written(event)
        if wire is None:
            continue
        payload = json.loads(wire.value)
        errors = [error.message for error in validator.iter_errors(payload)]
        assert not errors, f"{wire.value!r}: {errors}"


# -- near-valid payloads ---------------------------------------------------------------------


def _positions(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every position inside a JSON value (a member of an object, an item of an array)."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield (*path, name)
            yield from _positions(item, (*path, name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*path, index)
            yield from _positions(item, (*path, index))


def _objects(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        yield path
    for position in _positions(value, path):
        if isinstance(_at(value, position[len(path) :]), dict):
            yield position


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


@st.composite
def near_valid(draw: st.DrawFn, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A copy of ``payload`` with one change, and its name."""
    changed = json.loads(json.dumps(payload))
    positions = list(_positions(changed))
    kinds = ["extra"] + (["type", "range", "format", "missing"] if positions else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "extra":
        where = draw(st.sampled_from(list(_objects(changed))))
        _at(changed, where)[draw(st.sampled_from(["zz_added", "gift_wrap", "type", "$ref"]))] = (
            draw(st.sampled_from(OTHER_TYPES))
        )
        return f"extra at {where}", changed
    path = draw(st.sampled_from(positions))
    parent, last = _at(changed, path[:-1]), path[-1]
    if kind == "missing":
        if not isinstance(parent, dict):
            return "nothing", changed
        del parent[last]
        return f"missing {path}", changed
    current = parent[last]
    if kind == "type":
        choices = [v for v in OTHER_TYPES if type(v) is not type(current)]
        parent[last] = draw(st.sampled_from(choices))
    elif kind == "range":
        if isinstance(current, str):
            parent[last] = draw(st.sampled_from(["", current * 10, "x" * 300, *NEAR_FORMATS[:8]]))
        else:
            parent[last] = draw(st.sampled_from(BIG_NUMBERS))
    else:
        parent[last] = draw(st.sampled_from(NEAR_FORMATS))
    return f"{kind} at {path}: {current!r} → {parent[last]!r}", changed


def _reader(registry: EventRegistry, wire: Any, value: bytes) -> Event | EventDecodeError:
    try:
        return registry.decode(topic=wire.topic, key=wire.key, value=value, headers=wire.headers)
    except EventDecodeError as exc:
        return exc


def _same(given: Any, canonical: Any) -> bool:
    """Whether the reader took ``given`` as it is: its canonical form (what the writer writes
    of the event read) equals it, fields the reader ignores aside."""
    if isinstance(canonical, dict):
        return isinstance(given, dict) and all(
            _same(given[name], value) for name, value in canonical.items() if name in given
        )
    if isinstance(canonical, list):
        return (
            isinstance(given, list)
            and len(given) == len(canonical)
            and all(_same(g, c) for g, c in zip(given, canonical, strict=True))
        )
    if isinstance(canonical, bool) or isinstance(given, bool):
        return given is canonical
    return bool(type(given) is type(canonical) and given == canonical) or (
        isinstance(given, int | float) and isinstance(canonical, int | float) and given == canonical
    )


#: pydantic's error types for what the docs list as beyond standard JSON Schema.
_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_DIGITS = {"decimal_max_digits", "decimal_max_places", "decimal_whole_digits"}


def _beyond_json_schema(refusal: EventDecodeError) -> str | None:
    """Which documented limit of JSON Schema explains the reader's refusal, or ``None``. Every
    error must be one, or the error of another member of the union the value is in (the
    reader lists each member's)."""
    cause = refusal.__cause__
    if not isinstance(cause, ValidationError):
        return None
    errors = cause.errors(include_url=False)
    kinds = {error["loc"]: _documented(error) for error in errors}
    explained = [loc for loc, kind in kinds.items() if kind]
    for loc, kind in kinds.items():
        if kind is None and not any(_union_sibling(loc, known) for known in explained):
            return None
    return ", ".join(sorted({kind for kind in kinds.values() if kind})) or None


def _documented(error: Any) -> str | None:
    given = error.get("input")
    if error["type"] in _BOUNDS and isinstance(given, str):
        return "a Decimal's bound on its string form"
    if error["type"] in _DIGITS and isinstance(given, str) and "E" in given.upper():
        return "a Decimal's exponent digits"
    if error["type"] in _DIGITS and isinstance(given, int | float):
        return "a Decimal's digits and places in its number form"
    if "outside expected range" in error["msg"] and isinstance(given, str):
        return "a day that does not exist"
    if error["type"] == "int_parsing_size" and isinstance(given, float):
        return "an int written as a float past 64 bits"
    return None


def _union_sibling(loc: tuple[Any, ...], known: tuple[Any, ...]) -> bool:
    """Whether ``loc`` is in another member of a union ``known`` is in (a member's tag, then
    maybe an item's index)."""
    return any(
        len(loc) > depth and loc[:depth] == known[:depth] and isinstance(loc[depth], str)
        for depth in range(max(len(known) - 2, 0), len(known))
    )


def _check(spec: ModelSpec, model: type[Event], event: Event, data: st.DataObject) -> None:
    wire = _written(event)
    if wire is None:
        return
    registry = EventRegistry()
    registry.register(model)
    validator = _validator(model)
    change, payload = data.draw(near_valid(json.loads(wire.value)))
    value = json.dumps(payload).encode()
    read = _reader(registry, wire, value)
    schema_accepts = validator.is_valid(payload)
    if isinstance(read, EventDecodeError):
        if schema_accepts:
            beyond = _beyond_json_schema(read)
            assert beyond is not None, f"{change}: only the reader refuses it: {read}"
            note(f"documented: the schema cannot say {beyond}")
        else:
            note("both refuse")
    elif not schema_accepts:
        rewritten = _written(read)
        if rewritten is None:  # "Infinity" for a float: read as inf, which no writer writes
            note("documented: a lax form the reader coerces, to a value no writer writes")
            return
        canonical = json.loads(rewritten.value)
        errors = [error.message for error in validator.iter_errors(payload)]
        assert not _same(payload, canonical), (
            f"{change}: only the schema refuses it, and the reader took it as it is: {errors}"
        )
        note("documented: a lax form the reader coerces")
    else:
        note("both accept")


@PROPERTY
@given(st.data())
def test_the_schema_and_the_reader_agree_on_near_valid_payloads(data: st.DataObject) -> None:
    spec = data.draw(model_specs())
    model = build(spec)
    event = data.draw(events(spec, model))
    _check(spec, model, event, data)
