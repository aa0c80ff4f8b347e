"""CloudEvents that other producers write: what outboxkit's reader takes besides its own form.

outboxkit writes binary content mode with every attribute it needs (:mod:`outboxkit.schemas.wire`).
A service in another language, using its CloudEvents SDK, may write an event outboxkit reads
just as well, in a form of its own; unless the registry is strict
(``EventRegistry(strict_envelope=True)``), the reader takes:

===============================  ==================================================================
structured content mode          ``content-type: application/cloudevents+json``: the record value
                                 is the whole event as JSON (``specversion``, ``id``, ``source``,
                                 ``type``, ``time``, ``data``…); ``data`` is the payload object
                                 (``data_base64`` is refused). The other headers are user headers
an ``id`` that is not a UUID     any non-empty string of at most :data:`MAX_ID_LENGTH` characters:
                                 the event's ``id`` is then :func:`foreign_event_id` of its source
                                 and id (CloudEvents: an event is identified by both), the same in
                                 every reader, so that it stays the inbox's idempotency key
no ``schemaversion``             the version a trailing number of ``dataschema`` names
                                 (``…/order_placed/v2.json``, ``urn:…:OrderPlaced:2``), else the
                                 registry's default version of the type
                                 (:meth:`EventRegistry.assume_version`), else 1
no ``content-type``              (binary mode) the value is JSON, as CloudEvents' JSON format says
no ``time``                      the Kafka record's timestamp (``decode_record``; ``decode``'s
                                 ``record_time``), else refused (``missing_header``)
===============================  ==================================================================

The record key stays required: the inbox orders and the relay partitions by it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID, uuid5

from outboxkit.schemas.exceptions import DecodeErrorReason, EventDecodeError

#: The content type of structured content mode with the JSON event format.
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"

#: Longest ``id`` read from another producer: it is the idempotency key the inbox stores.
MAX_ID_LENGTH = 256

#: The namespace of :func:`foreign_event_id` (a UUID v5 namespace of outboxkit's own).
FOREIGN_ID_NAMESPACE = UUID("6c1f3e2a-8d4b-5f0e-9a7c-2b1d0e4f6a58")

#: A version at the end of a ``dataschema`` URI: ``…/v2``, ``…:2``, ``….v2.json``, ``…/2/``.
_DATASCHEMA_VERSION = re.compile(r"(?:^|[/:._-])[vV]?([1-9][0-9]{0,9})(?:\.json)?/?$", re.ASCII)

#: The structured event's attributes that become the envelope (the rest are ignored, as the
#: binary mode's unknown ``ce_*`` headers are).
_ATTRIBUTES = ("specversion", "id", "source", "type", "time", "schemaversion", "dataschema")


class ForeignForm(StrEnum):
    """A way another producer's CloudEvent differs from what outboxkit writes, as the reader
    reported it (``EventRegistry.decode(foreign_forms=…)``; the inbox counts each in
    ``outboxkit_inbox_foreign_records_total``): the rows of the table above."""

    STRUCTURED = "structured"
    DERIVED_ID = "derived_id"
    ASSUMED_VERSION = "assumed_version"
    IMPLIED_CONTENT_TYPE = "implied_content_type"
    RECORD_TIME = "record_time"


def foreign_event_id(source: str, event_id: str) -> str:
    """The event id outboxkit gives an event whose CloudEvents ``id`` is not a UUID: the UUID
    v5 of :data:`FOREIGN_ID_NAMESPACE` and ``source``, a line feed, ``event_id``."""
    return str(uuid5(FOREIGN_ID_NAMESPACE, f"{source}\n{event_id}"))


def check_foreign_id(event_id: str) -> None:
    """Raise ``EventDecodeError`` unless ``event_id`` can be a foreign event's id."""
    if not event_id:
        raise EventDecodeError(DecodeErrorReason.INVALID_HEADER, "ce_id is empty")
    if len(event_id) > MAX_ID_LENGTH:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER,
            f"ce_id has {len(event_id)} characters, over the {MAX_ID_LENGTH} an id may have",
        )


def version_of(event_type: str, dataschema: str | None, default_versions: Mapping[str, int]) -> int:
    """The version of an event that has no ``schemaversion``: the one its ``dataschema`` ends
    with, else its type's default, else 1."""
    if dataschema:
        match = _DATASCHEMA_VERSION.search(dataschema)
        if match is not None:
            return int(match.group(1))
    return default_versions.get(event_type, 1)


def is_structured(content_type: str | None) -> bool:
    """Whether a record's ``content-type`` header says structured content mode (JSON)."""
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == STRUCTURED_CONTENT_TYPE


def read_structured(value: bytes | None) -> tuple[dict[str, str], bytes]:
    """The attributes (as binary mode's ``ce_*`` header texts, by header name) and the payload
    (JSON bytes) of a structured-mode record value. Raises ``EventDecodeError``."""
    invalid = DecodeErrorReason.INVALID_VALUE
    if type(value) is not bytes:
        raise EventDecodeError(invalid, "a structured CloudEvent with no value (a tombstone?)")
    try:
        # Numbers as their text (Decimal): data is passed on as binary mode's value would be.
        document = json.loads(value, parse_float=Decimal, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise EventDecodeError(invalid, f"the structured CloudEvent is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise EventDecodeError(
            invalid, f"the structured CloudEvent is a JSON {type(document).__name__}, not an object"
        )
    if "data_base64" in document:
        raise EventDecodeError(
            invalid, "the structured CloudEvent holds data_base64: send its data as a JSON object"
        )
    content_type = document.get("datacontenttype")
    if content_type is not None and not _is_json(content_type):
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER,
            f"the structured CloudEvent's datacontenttype is {_short(content_type)}, expected "
            "application/json",
        )
    data = document.get("data")
    if not isinstance(data, dict):
        raise EventDecodeError(
            invalid,
            "the structured CloudEvent's data is "
            f"{'missing' if 'data' not in document else 'a JSON ' + type(data).__name__}, "
            "not an object",
        )
    attributes: dict[str, str] = {}
    for name in _ATTRIBUTES:
        found = document.get(name)
        if found is None:
            continue
        if name == "schemaversion" and type(found) is int:
            found = str(found)
        if not isinstance(found, str):
            raise EventDecodeError(
                DecodeErrorReason.INVALID_HEADER,
                f"the structured CloudEvent's {name} is a JSON {type(found).__name__}, "
                "not a string",
            )
        attributes[f"ce_{name}"] = found
    try:
        payload = "".join(_json_text(data)).encode()
    except RecursionError:
        raise EventDecodeError(
            invalid, "the structured CloudEvent's data is nested too deeply"
        ) from None
    return attributes, payload


def _json_text(value: Any) -> Iterator[str]:
    """``value`` (as ``json.loads`` read it, numbers with a fraction or an exponent as
    :class:`~decimal.Decimal`) written as JSON again, each number with the digits it was sent
    with: through a float, ``12345678901234567.89`` would become ``12345678901234568.0`` and
    ``1e400`` infinite — an event that did not arrive whole."""
    if isinstance(value, dict):
        yield "{"
        for index, (name, item) in enumerate(value.items()):
            yield f"{',' if index else ''}{json.dumps(name)}:"
            yield from _json_text(item)
        yield "}"
    elif isinstance(value, list):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ","
            yield from _json_text(item)
        yield "]"
    elif isinstance(value, Decimal):
        yield str(value)  # JSON's number grammar: 1.50, -0.0, 1E+400
    else:
        yield json.dumps(value)


def _no_constant(name: str) -> Any:
    """``NaN``, ``Infinity``: not JSON (Python's parser takes them unless told not to)."""
    raise ValueError(f"{name} is not a JSON value")


def _is_json(content_type: str) -> bool:
    return isinstance(content_type, str) and (
        content_type.split(";", 1)[0].strip().lower() == "application/json"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"
