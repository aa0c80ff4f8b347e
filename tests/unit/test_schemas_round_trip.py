"""The strict writer skips reading a record back only when the event is known to read back as
itself (schemas/round_trip.py): whatever that check passes, the read-back — a reader of the same
model — accepts and decodes to an equal event. Over generated models and values (every shape of
tests/event_models.py, and models of the plain shapes alone, so that the check is exercised), and
over values put around validation: ``model_copy(update=…)`` and a list changed in place.

And per class, the choice itself: a model whose schema can carry a mismatch (a validator, a
serialiser, an alias, an excluded field, a constraint, a changed setting, an int key…) has no
check, and every event of it is read back."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from hypothesis import event as note
from hypothesis import given
from hypothesis import strategies as st
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    StrictStr,
    computed_field,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from outboxkit.schemas import Event, EventRegistry, SchemaError, encode
from outboxkit.schemas.encoding import read_back
from outboxkit.schemas.round_trip import plain_check
from tests.event_models import (
    FieldSpec,
    ModelSpec,
    TypeSpec,
    build,
    build_nested,
    events,
    model_specs,
    property_settings,
    values_of,
)

PROPERTY = property_settings(100)


class Line(BaseModel):
    sku: str
    quantity: int
    price: Decimal


class Plain(Event, type="test.rt.plain", topic="t", key_field="k"):
    k: str
    n: int = 0
    ok: bool = False
    ratio: float = 0.0
    amount: Decimal = Decimal(0)
    ref: UUID | None = None
    day: date | None = None
    stamp: datetime | None = None
    aware: AwareDatetime | None = None
    lines: list[Line] = Field(default_factory=list)
    by_name: dict[str, list[float]] = Field(default_factory=dict)
    blob: bytes = b""
    first: Line | None = None
    again: Line | None = None  # one nested model twice: a definition and references


class Colour(StrEnum):
    RED = "red"


class Tree(BaseModel):
    children: list[Tree] = Field(default_factory=list)


class Stripped(BaseModel):
    model_config = ConfigDict(str_strip_whitespace=True)
    text: str


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class Checked(BaseModel):
    text: str

    @field_validator("text")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()


class Hidden(BaseModel):
    text: str
    _seen: int = PrivateAttr(default=0)


_made = iter(range(10**6))


def _label(case: Any) -> str:
    """A test id that names the case the same way in every process (no addresses)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(case))


def _one_field(annotation: Any, **config: Any) -> type[Event]:
    """An event class of one payload field ``v`` (and its key)."""
    namespace: dict[str, Any] = {"__annotations__": {"k": str, "v": annotation}}
    if config:
        namespace["model_config"] = ConfigDict(**config)  # type: ignore[typeddict-item]
    return type(Event)(
        f"One{next(_made)}",
        (Event,),
        namespace,
        type=f"test.rt.one{next(_made)}",
        topic="t",
        key_field="k",
    )


class WithValidator(Event, type="test.rt.validator", topic="t", key_field="k"):
    k: str

    @field_validator("k")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip()


class WithEnvelopeValidator(Event, type="test.rt.envelope", topic="t", key_field="k"):
    k: str

    @field_validator("key")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class WithModelValidator(Event, type="test.rt.model_validator", topic="t", key_field="k"):
    k: str

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        return data


class WithFieldSerializer(Event, type="test.rt.field_serializer", topic="t", key_field="k"):
    k: str
    stamp: datetime

    @field_serializer("stamp")
    def _mark(self, value: datetime) -> str:
        return value.isoformat() + "!"


class WithModelSerializer(Event, type="test.rt.model_serializer", topic="t", key_field="k"):
    k: str

    @model_serializer(mode="wrap")
    def _all(self, handler: Any) -> Any:
        return handler(self)


class WithComputed(Event, type="test.rt.computed", topic="t", key_field="k"):
    k: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def twice(self) -> str:
        return self.k * 2


class WithPrivate(Event, type="test.rt.private", topic="t", key_field="k"):
    k: str
    _cache: int = PrivateAttr(default=0)


class WithAlias(Event, type="test.rt.alias", topic="t", key_field="k"):
    k: str
    klass: str = Field(default="", alias="class")


class WithExcluded(Event, type="test.rt.excluded", topic="t", key_field="k"):
    k: str
    secret: int = Field(default=0, exclude=True)


class WithOwnDump(Event, type="test.rt.own_dump", topic="t", key_field="k"):
    k: str

    def model_dump_json(self, **kwargs: Any) -> str:
        return '{"k": "another"}'


class WithInit(Event, type="test.rt.post_init", topic="t", key_field="k"):
    k: str

    def model_post_init(self, context: Any) -> None:
        pass


@pytest.mark.parametrize(
    "annotation",
    [
        str,
        int,
        bool,
        float,
        Decimal,
        UUID,
        date,
        datetime,
        AwareDatetime,
        bytes,
        str | None,
        list[int],
        list[list[str]],
        dict[str, Decimal],
        Line,
        list[Line] | None,
        dict[str, Line],
    ],
    ids=_label,
)
def test_a_model_of_plain_shapes_has_a_check(annotation: Any) -> None:
    assert plain_check(_one_field(annotation)) is not None


def test_the_plain_model_has_a_check_and_settings_without_aliases_keep_it() -> None:
    assert plain_check(Plain) is not None
    assert plain_check(_one_field(str, validate_by_name=True, serialize_by_alias=True)) is not None


@pytest.mark.parametrize(
    "annotation",
    [
        dict[int | str, str],  # int keys are read back as str
        dict[int, str],
        Annotated[str, Field(max_length=3)],  # a constraint a value around validation breaks
        Annotated[int, Field(gt=0)],
        Annotated[Decimal, Field(max_digits=4)],
        StrictStr,
        Annotated[str, AfterValidator(str.strip)],
        Annotated[datetime, PlainSerializer(lambda v: v.isoformat() + "!", return_type=str)],
        Colour,
        Literal["a", "b"],
        str | int,  # a union: which member reads the value
        tuple[int, ...],
        set[str],
        frozenset[str],
        time,
        timedelta,
        Any,
        Tree,  # recursive
        Stripped,  # a setting of its own
        Extra,  # extra="allow": the extras are written, and read back
        Checked,  # a validator of its own
        Hidden,  # a private attribute: readers give its default
        list[Checked],
    ],
    ids=_label,
)
def test_a_shape_that_can_carry_a_mismatch_has_no_check(annotation: Any) -> None:
    assert plain_check(_one_field(annotation)) is None


@pytest.mark.parametrize(
    "config",
    [
        {"str_strip_whitespace": True},
        {"str_to_lower": True},
        {"strict": True},
        {"coerce_numbers_to_str": True},
        {"ser_json_inf_nan": "constants"},
        {"str_max_length": 3},
    ],
    ids=_label,
)
def test_a_setting_of_the_event_class_takes_the_read_back(config: dict[str, Any]) -> None:
    assert plain_check(_one_field(str, **config)) is None


@pytest.mark.parametrize(
    "cls",
    [
        WithValidator,
        WithEnvelopeValidator,
        WithModelValidator,
        WithFieldSerializer,
        WithModelSerializer,
        WithComputed,
        WithPrivate,
        WithAlias,
        WithExcluded,
        WithInit,
        WithOwnDump,
    ],
    ids=lambda cls: cls.__name__,
)
def test_a_class_with_code_or_names_of_its_own_takes_the_read_back(cls: type[Event]) -> None:
    assert plain_check(cls) is None


def _whole(event: Event) -> bool:
    check = plain_check(type(event))
    return check is not None and check(event)


def plain_event(**fields: Any) -> Plain:
    return Plain(k="1", **fields)


@pytest.mark.parametrize(
    "update",
    [
        {"n": True},  # a bool in an int field
        {"n": "5"},
        {"n": 2**63},  # far below what a reader refuses, but above the check's bound
        {"ratio": float("inf")},
        {"ratio": float("nan")},
        {"ratio": 1},
        {"amount": Decimal("NaN")},
        {"amount": Decimal("Infinity")},
        {"amount": 1.5},
        {"ref": str(UUID(int=1))},
        {"blob": "text"},
        {"blob": bytearray(b"text")},
        {"day": datetime(2026, 1, 1)},  # a datetime is a date, and is written as one
        {"stamp": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))},
        {"aware": datetime(2026, 1, 1)},
        {"lines": (Line(sku="a", quantity=1, price=Decimal(1)),)},
        {"lines": [{"sku": "a", "quantity": 1, "price": "1"}]},
        {"by_name": {1: [1.0]}},
        {"by_name": {"\ud800": [1.0]}},  # pydantic writes such a key as another character
        {"by_name": {"a": [float("-inf")]}},
        {"first": Line.model_construct(sku="a", quantity="1", price=Decimal(1))},
        {"first": Line.model_construct(sku="a")},  # fields missing
        {"occurred_at": datetime(2026, 1, 1)},
        {"occurred_at": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=1)))},
        {"key": ""},
        {"key": "\ud800"},
        {"topic": "no spaces"},
        {"id": str(UUID(int=1))},
        {"headers": {"ce_type": "forged"}},
        {"headers": {"x": 1}},
        {"headers": {"x": "\udc80"}},
    ],
    ids=_label,
)
def test_a_value_put_around_validation_is_read_back(update: dict[str, Any]) -> None:
    event = plain_event().model_copy(update=update)
    assert not _whole(event)


def test_an_event_whose_own_dump_writes_another_value_is_refused() -> None:
    with pytest.raises(SchemaError, match="another value of k"):
        encode(WithOwnDump(k="1"), source="urn:test")


def test_a_list_changed_in_place_is_read_back_and_refused() -> None:
    event = plain_event(by_name={"a": [1.0]})
    assert _whole(event)
    event.by_name["a"].append(float("inf"))
    assert not _whole(event)
    with pytest.raises(SchemaError, match="by_name holds an infinite or NaN float"):
        encode(event, source="urn:test")


def test_a_plain_event_is_written_without_a_read_back_and_read_back_equal() -> None:
    line = Line(sku="s", quantity=2, price=Decimal("9.90"))
    event = plain_event(
        n=-(2**62),
        ok=True,
        ratio=5e-324,
        amount=Decimal("-0.00"),
        ref=UUID(int=7),
        day=date(1, 1, 1),
        stamp=datetime(9999, 12, 31, 23, 59, 59, 999999),
        aware=datetime(2026, 3, 1, tzinfo=UTC),
        lines=[line],
        by_name={"ünï": [1e308, -0.0]},
        first=line,
        again=line,
        headers={"correlation-id": "ü"},
        blob="ü\x00".encode(),
    )
    assert _whole(event)
    _assert_reads_back(event)


def _assert_reads_back(event: Event) -> None:
    """What the check passed: written, and both the read-back and a registry accept it."""
    try:
        record = encode(event, source="urn:test")
    except SchemaError as exc:
        refused = str(exc)
    else:
        refused = ""
    if refused:
        assert "cannot be written as JSON" in refused  # refused as it is serialised: fine
        return
    read_back(event, record)
    registry = EventRegistry()
    registry.register(type(event))
    decoded = registry.decode(
        topic=record.topic, key=record.key, value=record.value, headers=record.headers
    )
    assert decoded == event


#: Any text, now and then with a lone surrogate (pydantic refuses to write one in a value, and
#: writes one in a dict key as another character).
_TEXT = st.text() | st.sampled_from(["\ud800", "a\udfff", '\x00\u2028\\"'])

# Plain shapes only, so that most drawn models have a check; values across each type's range.
_PLAIN_SCALARS = [
    TypeSpec(str, _TEXT),
    TypeSpec(int, st.integers()),
    TypeSpec(bool, st.booleans()),
    TypeSpec(float, st.floats()),
    TypeSpec(Decimal, st.decimals(allow_nan=False, allow_infinity=False)),
    TypeSpec(UUID, st.uuids()),
    TypeSpec(date, st.dates()),
    # Mostly UTF-8 (written), now and then not (refused as it is written).
    TypeSpec(bytes, st.text().map(str.encode) | st.binary()),
    TypeSpec(datetime, st.datetimes() | st.datetimes(timezones=st.just(UTC))),
    TypeSpec(
        datetime,
        st.datetimes(
            min_value=datetime(1, 1, 2),
            max_value=datetime(9999, 12, 30),
            timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5, minutes=-30))]),
        ),
    ),
    TypeSpec(AwareDatetime, st.datetimes(timezones=st.just(UTC))),
]


@st.composite
def plain_types(draw: st.DrawFn, depth: int = 2) -> TypeSpec:
    kind = draw(st.sampled_from(["scalar"] * 3 + (["list", "dict", "optional", "model"] * depth)))
    if kind == "scalar" or depth == 0:
        return draw(st.sampled_from(_PLAIN_SCALARS))
    inner = draw(plain_types(depth=depth - 1))
    if kind == "list":
        return TypeSpec(list[inner.annotation], st.lists(inner.values, max_size=3))
    if kind == "dict":
        return TypeSpec(
            dict[str, inner.annotation], st.dictionaries(_TEXT, inner.values, max_size=3)
        )
    if kind == "optional":
        return TypeSpec(inner.annotation | None, st.none() | inner.values)
    spec = draw(plain_model_specs(depth=depth - 1))
    nested = build_nested(spec)
    return TypeSpec(nested, values_of(spec, nested))


@st.composite
def plain_model_specs(draw: st.DrawFn, depth: int = 2) -> ModelSpec:
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=5, unique=True))
    fields = []
    for name in names:
        spec = draw(plain_types(depth=depth))
        defaulted = draw(st.booleans())
        default = draw(spec.values) if defaulted else None
        fields.append(FieldSpec(name, name, spec, default, defaulted))
    return ModelSpec(tuple(fields), strict_reader=draw(st.booleans()))


@st.composite
def drawn_events(draw: st.DrawFn, specs: st.SearchStrategy[ModelSpec]) -> Event:
    spec = draw(specs)
    return draw(events(spec, build(spec)))


#: Values of every kind, to put around validation.
_FOREIGN = st.one_of(
    st.none(),
    _TEXT,
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.floats(),
    st.booleans(),
    st.decimals(),
    st.uuids(),
    st.uuids().map(str),
    st.binary(),
    st.dates(),
    st.datetimes(timezones=st.none() | st.just(UTC) | st.timezones()),
    st.lists(st.integers() | st.floats() | st.text(), max_size=3),
    st.dictionaries(st.integers() | _TEXT, st.integers(), max_size=3),
    st.builds(
        Line,
        sku=st.text(),
        quantity=st.integers(),
        price=st.decimals(allow_nan=False, allow_infinity=False),
    ),
)


def _soundness(event: Event) -> None:
    whole = _whole(event)
    note(f"class has a check: {plain_check(type(event)) is not None}; passes: {whole}")
    if whole:
        _assert_reads_back(event)


@PROPERTY
@given(drawn_events(plain_model_specs()))
def test_a_plain_event_reads_back_whole_when_the_check_passes(event: Event) -> None:
    _soundness(event)


@PROPERTY
@given(drawn_events(plain_model_specs() | model_specs()), st.data())
def test_any_event_reads_back_whole_when_the_check_passes_also_around_validation(
    event: Event, data: st.DataObject
) -> None:
    """Any model's event, as drawn or with one value put around validation (a
    ``model_copy(update=…)`` or an item added to a list in place)."""
    how = data.draw(st.sampled_from(["model_copy", "in place", "as drawn"]))
    name = data.draw(st.sampled_from(type(event).event_payload_fields))
    value = getattr(event, name)
    if how == "in place" and isinstance(value, list):
        value.append(data.draw(_FOREIGN))
    elif how != "as drawn":
        how = "model_copy"
        event = event.model_copy(update={name: data.draw(_FOREIGN)})
    note(how)
    _soundness(event)
