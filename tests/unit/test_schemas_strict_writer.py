"""Writing is strict: what a reader of the same model would refuse, or read as another event,
``encode`` refuses (every outbox's ``add()`` calls it), naming the field; and ``source`` is a
URI-reference, as CloudEvents requires of ``ce_source``.

Each case failed before the strict writer: the record was written, then dead-lettered (or
read with another value) by every consumer."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, Field, field_serializer

from outboxkit.relay import InMemoryOutbox, InMemoryOutboxStorage
from outboxkit.schemas import (
    Event,
    EventDefinitionError,
    EventRegistry,
    SchemaError,
    check_source,
    encode,
)


class Reading(BaseModel):
    value: float


class Measured(Event, type="test.measured", topic="t", key_field="k"):
    k: str
    ratio: float = 0.0
    maybe: float | None = None
    series: list[float] = Field(default_factory=list)
    by_name: dict[str, float] = Field(default_factory=dict)
    reading: Reading | None = None
    note: str = ""
    blob: bytes = b""
    secret: int = Field(default=0, exclude=True)
    ids: dict[int | str, str] = Field(default_factory=dict)


class Stamped(Event, type="test.stamped", topic="t", key_field="k"):
    k: str
    stamp: datetime

    @field_serializer("stamp")
    def _with_a_mark(self, value: datetime) -> str:
        return value.isoformat() + "!"


def refused(**fields: Any) -> str:
    with pytest.raises(SchemaError) as caught:
        encode(Measured(k="1", **fields), source="urn:test")
    return str(caught.value)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"ratio": float("inf")}, "ratio"),
        ({"ratio": float("-inf")}, "ratio"),
        ({"ratio": float("nan")}, "ratio"),
        ({"maybe": float("nan")}, "maybe"),  # written as null, read back as None
        ({"series": [1.0, float("inf")]}, "series"),
        ({"by_name": {"a": float("nan")}}, "by_name"),
        ({"reading": Reading(value=float("inf"))}, "reading"),
    ],
)
def test_a_non_finite_float_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    message = refused(**fields)
    assert f"{field} holds an infinite or NaN float" in message
    assert "JSON cannot carry" in message


def test_what_cannot_be_written_as_json_is_refused_naming_the_field() -> None:
    assert "note: " in refused(note="\ud800")  # a lone surrogate
    assert "blob: " in refused(blob=b"\xff")  # bytes are written as UTF-8 text


def test_a_value_that_reads_back_as_another_is_refused_naming_the_field() -> None:
    assert "another value of secret" in refused(secret=5)  # excluded: readers get the default
    assert "another value of ids" in refused(ids={1: "a", "1": "b"})  # one JSON key
    assert "another value of ids" in refused(ids={1: "a"})  # "1" is read as the str member
    with pytest.raises(SchemaError, match=r"refuse the record .*stamp: Input should be"):
        encode(Stamped(k="1", stamp=datetime(2026, 2, 1, tzinfo=UTC)), source="urn:test")


def test_what_the_writer_accepts_a_reader_reads_back_equal() -> None:
    event = Measured(k="1", ratio=1e308, maybe=-0.0, series=[5e-324], secret=0, ids={"1": "a"})
    wire = encode(event, source="urn:test")
    registry = EventRegistry()
    registry.register(Measured)
    decoded = registry.decode(
        topic=wire.topic, key=wire.key, value=wire.value, headers=wire.headers
    )
    assert decoded == event


@pytest.mark.parametrize(
    "source",
    [
        "urn:service:orders",
        "orders",
        "/shop/orders",
        "https://shop.example/orders?region=eu#1",
        "//host:8080/path",
        "urn:x:%C3%BC",
        "mailto:ops@example.com",
        "http://[::1]/x",
    ],
)
def test_a_uri_reference_is_a_source(source: str) -> None:
    assert check_source(source) == source
    assert dict(encode(Measured(k="1"), source=source).headers)["ce_source"] == source.encode()


@pytest.mark.parametrize(
    ("source", "fix"),
    [
        ("interop shop", "percent-encode it ('interop%20shop')"),
        ("ünï", "percent-encode it ('%C3%BCn%C3%AF')"),
        ("a b:c", "name the service as a URN"),  # 'a b' is no scheme: no percent-encoded fix
        ("1abc:x", "name the service as a URN"),
        ("x#a#b", "name the service as a URN"),
        ('say "hi"', "percent-encode it"),
    ],
)
def test_a_source_that_is_no_uri_reference_is_refused_with_the_fix(source: str, fix: str) -> None:
    with pytest.raises(SchemaError, match="not a URI-reference") as caught:
        check_source(source)
    assert fix in str(caught.value)
    assert "urn:service:orders" in str(caught.value)
    with pytest.raises(SchemaError, match="not a URI-reference"):
        encode(Measured(k="1"), source=source)


def test_every_outbox_refuses_a_source_that_is_no_uri_reference() -> None:
    from outboxkit.relay.mongodb.writer import MongoOutbox  # noqa: PLC0415 (drivers load lazily)
    from outboxkit.relay.postgres.writer import PostgresOutbox  # noqa: PLC0415
    from outboxkit.service import Outboxkit  # noqa: PLC0415

    with pytest.raises(SchemaError, match="interop%20shop"):
        PostgresOutbox(source="interop shop")
    with pytest.raises(SchemaError, match="interop%20shop"):
        MongoOutbox(source="interop shop", database="shop")
    with pytest.raises(SchemaError, match="interop%20shop"):
        InMemoryOutbox(InMemoryOutboxStorage(), source="interop shop")
    with pytest.raises(SchemaError, match="interop%20shop"):
        Outboxkit(source="interop shop")


def test_a_payload_field_cannot_take_an_envelope_fields_name_as_its_alias() -> None:
    """Readers refuse a payload holding an envelope field: such a model could write nothing."""
    with pytest.raises(EventDefinitionError, match="alias 'id'"):

        class Aliased(Event, type="test.aliased", topic="t"):
            ident: str = Field(alias="id")
