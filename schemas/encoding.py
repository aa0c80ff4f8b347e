""":func:`encode`: an event → its Kafka record, refused when a reader would not read it whole.

Writing is strict (docs/schemas.md, "Field names and values"): every writer (the PostgreSQL,
MongoDB and in-memory outboxes) calls :func:`encode` at ``add()``, inside the caller's
transaction, and :func:`encode` reads the record back the way every reader of the same model
does (:func:`outboxkit.schemas.wire.build_event`, with the registry's validator). A record the
reader would refuse, or would decode to a different event, is refused there, naming the field:
a ``float('inf')`` (JSON has no infinity: it is written as ``null``, which no ``float`` field
reads), a value a field's serialiser writes in a form its validator does not read, a field
excluded from serialisation that holds something else than its default… A dead letter at every
consumer becomes an exception in the service that can still fix it.

``source`` (CloudEvents ``source``) must be a URI-reference (RFC 3986), as the CloudEvents
specification requires: :func:`check_source`.
"""

from __future__ import annotations

import functools
import math
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from pydantic import BaseModel
from pydantic_core import SchemaValidator

from outboxkit.core.tracing import trace_headers
from outboxkit.schemas.bounded import bounded_validator
from outboxkit.schemas.event import Event
from outboxkit.schemas.exceptions import EventDecodeError, SchemaError
from outboxkit.schemas.round_trip import plain_check
from outboxkit.schemas.wire import (
    CONTENT_TYPE,
    DATA_SCHEMA_HEADER,
    SPEC_VERSION,
    EncodedEvent,
    Envelope,
    WireHeader,
    build_event,
    format_time,
)

# RFC 3986, appendix A: URI-reference = URI / relative-ref. (An IP literal is checked for its
# characters only.)
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_QUERY = rf"(?:{_PCHAR}|[/?])*"
_HOST = (
    rf"(?:\[[0-9A-Za-z:.{_UNRESERVED}{_SUB_DELIMS}]+\]|(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*)"
)
_AUTHORITY = rf"(?:(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?{_HOST}(?::[0-9]*)?"
_TAIL = rf"(?:/{_PCHAR}*)*"
_ABSOLUTE = rf"/(?:{_PCHAR}+{_TAIL})?"
_NO_SCHEME = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}@]|{_PCT})+{_TAIL}"
_ENDING = rf"(?:\?{_QUERY})?(?:#{_QUERY})?"
_URI_REFERENCE = re.compile(
    rf"[A-Za-z][A-Za-z0-9+.\-]*:(?://{_AUTHORITY}{_TAIL}|{_ABSOLUTE}|{_PCHAR}+{_TAIL}|){_ENDING}"
    rf"|(?://{_AUTHORITY}{_TAIL}|{_ABSOLUTE}|{_NO_SCHEME}|){_ENDING}"
)
#: Characters a URI-reference may hold as they are (the rest is percent-encoded).
_URI_CHARACTERS = f"{_UNRESERVED.replace(chr(92), '')}{_SUB_DELIMS}:@/?#[]%"


@functools.lru_cache(maxsize=256)
def check_source(source: str) -> str:
    """``source`` if it is a non-empty URI-reference (RFC 3986), as CloudEvents requires of
    ``ce_source``; raises :class:`SchemaError` saying how to write it otherwise."""
    if not isinstance(source, str) or not source:
        raise SchemaError(
            "source must be a non-empty URI-reference naming the producer, e.g. "
            "'urn:service:orders' or '/shop/orders'"
        )
    if _URI_REFERENCE.fullmatch(source) is None:
        fixed = urllib.parse.quote(source, safe=_URI_CHARACTERS)
        hint = f"percent-encode it ({fixed!r}), or " if _URI_REFERENCE.fullmatch(fixed) else ""
        raise SchemaError(
            f"source {source!r} is not a URI-reference (RFC 3986), which CloudEvents requires "
            f"of ce_source: {hint}name the service as a URN, e.g. 'urn:service:orders'"
        )
    return source


@dataclass(frozen=True, slots=True)
class _ClassPlan:
    """What :func:`encode` needs of an event class, decided once per class."""

    #: The payload fields (``include=`` of the serialisation).
    payload: set[str]
    #: ``ce_type``, ``ce_schemaversion`` and ``ce_dataschema``: the class's own.
    type_header: tuple[str, bytes]
    version_header: tuple[str, bytes]
    dataschema_header: tuple[str, bytes]
    #: Whether an event of the class is known to read back as itself without being read back
    #: (:mod:`outboxkit.schemas.round_trip`); ``None``: every event of it is read back.
    reads_back_whole: Callable[[Event], bool] | None


_PLANS: WeakKeyDictionary[type[Event], _ClassPlan] = WeakKeyDictionary()
_SPEC_VERSION_HEADER = (WireHeader.SPEC_VERSION.value, SPEC_VERSION.encode())
_CONTENT_TYPE_HEADER = (WireHeader.CONTENT_TYPE.value, CONTENT_TYPE.encode())
_ID, _SOURCE, _TIME = WireHeader.ID.value, WireHeader.SOURCE.value, WireHeader.TIME.value


def _plan(cls: type[Event]) -> _ClassPlan:
    try:
        return _PLANS[cls]
    except KeyError:
        plan = _PLANS[cls] = _ClassPlan(
            payload=set(cls.event_payload_fields),
            type_header=(WireHeader.TYPE.value, cls.event_type.encode()),
            version_header=(WireHeader.SCHEMA_VERSION.value, str(cls.event_version).encode()),
            dataschema_header=(DATA_SCHEMA_HEADER, cls.event_dataschema.encode()),
            reads_back_whole=plain_check(cls),
        )
        return plan


def encode(event: Event, *, source: str) -> EncodedEvent:
    """The Kafka record for ``event``; ``source`` identifies the producer (``ce_source``).

    Raises :class:`SchemaError` when ``source`` is not a URI-reference, or when a reader of
    ``event``'s model would refuse the record or read another event from it (the message names
    the fields)."""
    check_source(source)
    plan = _plan(type(event))
    headers: list[tuple[str, bytes]] = [
        _SPEC_VERSION_HEADER,
        (_ID, str(event.id).encode()),
        (_SOURCE, source.encode()),
        plan.type_header,
        (_TIME, format_time(event.occurred_at).encode()),
        plan.version_header,
        _CONTENT_TYPE_HEADER,
        # After the required seven: the Spark pipeline reads them by position.
        plan.dataschema_header,
    ]
    if event.headers:
        headers.extend((name, value.encode()) for name, value in event.headers.items())
    # The writer's trace context (OpenTelemetry, when the process uses it): every writer calls
    # encode, so the PostgreSQL, in-memory and MongoDB outboxes all carry it to the consumer.
    trace = trace_headers()
    if trace:
        headers.extend(
            (name, value.encode()) for name, value in trace.items() if name not in event.headers
        )
    try:
        payload = event.model_dump_json(include=plan.payload, by_alias=True).encode()
    except ValueError as exc:  # pydantic's serialisation errors (a lone surrogate, bad bytes…)
        raise SchemaError(
            f"{_name(event)} cannot be written as JSON: {_unwritable(event)}{exc}"
        ) from exc
    record = EncodedEvent(
        topic=event.topic, key=event.key.encode(), value=payload, headers=tuple(headers)
    )
    # Most events are known to read back as themselves from their types alone (checked value
    # by value, a fraction of a validation); any other is read back.
    if plan.reads_back_whole is None or not plan.reads_back_whole(event):
        read_back(event, record)
    return record


_VALIDATORS: WeakKeyDictionary[type[Event], SchemaValidator] = WeakKeyDictionary()


def read_back(event: Event, record: EncodedEvent) -> None:
    """Decode ``record`` (its key and value, its ``ce_id`` and ``ce_time``; the rest of the
    envelope from ``event``) the way a reader of ``event``'s model does, and raise
    :class:`SchemaError` unless that gives ``event`` again."""
    cls = type(event)
    validator = _VALIDATORS.get(cls)
    if validator is None:
        validator = _VALIDATORS[cls] = bounded_validator(cls, tolerant=not cls.event_strict_reader)
    envelope = Envelope(
        id_text=_written(record, _ID),
        source="",
        event_type=cls.event_type,
        time_text=_written(record, _TIME),
        version=cls.event_version,
        headers=dict(event.headers),
        canonical_time=True,
    )
    try:
        decoded = build_event(
            cls,
            envelope,
            topic=record.topic,
            key=record.key,
            value=record.value,
            validator=validator,
        )
    except EventDecodeError as exc:
        raise SchemaError(
            f"{_name(event)} cannot be written: {_non_finite(event)}its readers would refuse "
            f"the record ({exc})"
        ) from None
    if decoded != event:
        changed = [
            name
            for name in cls.model_fields
            if getattr(decoded, name, None) != getattr(event, name, None)
        ]
        raise SchemaError(
            f"{_name(event)} cannot be written: {_non_finite(event, changed)}its readers would "
            f"read another value of {', '.join(changed) or 'the event'} than the one written "
            "(the field's JSON form does not read back as the same value)"
        )


def _written(record: EncodedEvent, name: str) -> str:
    """The first header ``name`` of ``record`` (where :func:`encode` puts it), as text."""
    return next(value for header, value in record.headers if header == name).decode()


def _non_finite(event: Event, names: list[str] | None = None) -> str:
    """Which payload fields hold an infinite or NaN float (JSON writes them as ``null``)."""
    found = [
        name
        for name in (names if names is not None else event.event_payload_fields)
        if _has_non_finite(getattr(event, name, None))
    ]
    if not found:
        return ""
    return (
        f"{', '.join(found)} holds an infinite or NaN float, which JSON cannot carry (it is "
        "written as null): keep such values out of the event, or use None or a Decimal; "
    )


def _unwritable(event: Event) -> str:
    """The payload fields that cannot be written as JSON, each alone (pydantic's error does not
    say where it is)."""
    failing = []
    for name in event.event_payload_fields:
        try:
            event.model_dump_json(include={name})
        except ValueError:
            failing.append(name)
    return f"{', '.join(failing)}: " if failing else ""


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(k) or _has_non_finite(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_has_non_finite(item) for item in value)
    if isinstance(value, BaseModel):
        return any(_has_non_finite(item) for item in value.__dict__.values())
    return False


def _name(event: Event) -> str:
    return type(event).__name__
