"""CloudEvents 1.0 Kafka protocol binding, binary content mode.

One event is one Kafka record:

========================  =====================================================================
record key                ``event.key`` (UTF-8)
record value              the payload fields only, as compact UTF-8 JSON
``ce_specversion``        ``1.0``
``ce_id``                 ``event.id`` (canonical UUID text)
``ce_source``             the producing service, given to :func:`encode` (not part of the model)
``ce_type``               ``event_type`` of the class
``ce_time``               ``event.occurred_at``, RFC 3339 in UTC with microseconds
``ce_schemaversion``      ``event_version`` of the class (a CloudEvents extension attribute)
``content-type``          ``application/json``
``ce_dataschema``         ``event_dataschema`` of the class: the URI of its schema (optional
                          when decoding: records written before it existed have none)
other headers             ``event.headers``, one Kafka header each (UTF-8 values)
``traceparent``           the writer's current span (W3C Trace Context) when the process uses
                          OpenTelemetry and ``event.headers`` has none (``core/tracing.py``)
========================  =====================================================================

The topic is the record's topic. Encoding is :func:`outboxkit.schemas.encoding.encode`, which
reads each record back with :func:`build_event` below before it is written. Decoding lives in
:meth:`outboxkit.schemas.EventRegistry.decode`, which uses :func:`read_envelope` and
:func:`build_event`; both raise only :class:`EventDecodeError`.
"""

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import ValidationError
from pydantic_core import SchemaValidator

from outboxkit.schemas.bounded import MORE_UNKNOWN_KEYS
from outboxkit.schemas.event import ENVELOPE_FIELDS, Event, is_reserved_header
from outboxkit.schemas.exceptions import DecodeErrorReason, EventDecodeError
from outboxkit.schemas.foreign import (
    STRUCTURED_CONTENT_TYPE,
    ForeignForm,
    check_foreign_id,
    foreign_event_id,
    is_structured,
    read_structured,
    version_of,
)

#: The CloudEvents ``dataschema`` attribute's header: sent, never required.
DATA_SCHEMA_HEADER = "ce_dataschema"

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"


class WireHeader(StrEnum):
    """Names of the Kafka headers the binding uses (the Spark job reads them too)."""

    SPEC_VERSION = "ce_specversion"
    ID = "ce_id"
    SOURCE = "ce_source"
    TYPE = "ce_type"
    TIME = "ce_time"
    SCHEMA_VERSION = "ce_schemaversion"
    CONTENT_TYPE = "content-type"


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """A Kafka record ready to send.

    With aiokafka: ``producer.send(r.topic, r.value, key=r.key, headers=list(r.headers))``
    (its record builder insists on a list).
    """

    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Envelope:
    """The CloudEvents attributes read from a record's headers."""

    #: ``ce_id`` in canonical form (``str(uuid)``).
    id_text: str
    source: str
    event_type: str
    #: ``ce_time`` as sent; :attr:`time` parses it.
    time_text: str
    version: int
    headers: dict[str, str]
    #: ``time_text`` is in the form :func:`format_time` writes.
    canonical_time: bool = False
    #: How the record differs from outboxkit's own form (another producer's CloudEvent); with
    #: ``ASSUMED_VERSION``, :attr:`version` is the one its ``dataschema`` names, or its type's
    #: default.
    foreign_forms: frozenset[ForeignForm] = frozenset()

    @property
    def id(self) -> UUID:
        return UUID(self.id_text)

    @property
    def time(self) -> datetime:
        """``ce_time`` in UTC. Raises ``ValueError`` if it is not RFC 3339 (checked when read,
        except for the canonical form :func:`encode` writes, which the model validates)."""
        return parse_time(self.time_text)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, e.g. ``2024-05-01T12:00:00.000000Z``."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime (digits past microseconds dropped).

    Raises ``ValueError`` when ``text`` is not RFC 3339 or is out of range.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError("not an RFC 3339 timestamp")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    if zulu:
        tz = UTC
    else:
        if int(off_h) > 23 or int(off_m) > 59:
            raise ValueError("UTC offset out of range")
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        tz = timezone(-offset if sign == "-" else offset)
    try:
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=tz,
        )
        return moment.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("timestamp out of range") from exc


def preview(text: str, limit: int = 80) -> str:
    """``repr`` of untrusted text, shortened for an error message."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text)} chars)"


_REQUIRED = (
    WireHeader.SPEC_VERSION,
    WireHeader.ID,
    WireHeader.SOURCE,
    WireHeader.TYPE,
    WireHeader.TIME,
    WireHeader.SCHEMA_VERSION,
    WireHeader.CONTENT_TYPE,
)
_REQUIRED_NAMES = frozenset(name.value for name in _REQUIRED)
#: What an event of another producer must have (:mod:`outboxkit.schemas.foreign`).
_REQUIRED_OF_ANY_PRODUCER = tuple(
    name for name in _REQUIRED if name not in (WireHeader.SCHEMA_VERSION, WireHeader.CONTENT_TYPE)
)
_SCHEMA_VERSION = re.compile(r"[1-9][0-9]{0,9}", re.ASCII)
# What format_time gives (and encode sends): validated by the model, not parsed here first.
_CANONICAL_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)
# What ``str(uuid)`` gives (and encode sends): taken as it is, without building a UUID.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# An envelope of outboxkit's own form (shared: none is built per record).
_NO_FORMS: frozenset[ForeignForm] = frozenset()


def _header_text(name: str, value: object) -> str:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER, f"header {preview(name)} has no bytes value"
        )
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER, f"header {preview(name)} is not valid UTF-8"
        ) from None


def _split_headers(headers: Iterable[tuple[str, bytes]]) -> tuple[dict[str, str], dict[str, str]]:
    """Protocol headers and user headers, both decoded; unknown ``ce_*`` headers are ignored,
    but for the first valid ``ce_dataschema`` (a foreign event's version may be in it)."""
    protocol: dict[str, str] = {}
    user: dict[str, str] = {}
    try:
        items = headers if type(headers) is tuple or type(headers) is list else list(headers)
    except Exception as exc:  # any iterable the caller passed; report, never leak
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER, "headers are not iterable"
        ) from exc
    for item in items:
        exact = type(item) is tuple and len(item) == 2 and type(item[0]) is str
        if not exact and (
            not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str)
        ):
            raise EventDecodeError(
                DecodeErrorReason.INVALID_HEADER, "a header is not a (str, bytes) pair"
            )
        name, raw = item
        if name in _REQUIRED_NAMES:
            target = protocol
        elif is_reserved_header(name):
            if name == DATA_SCHEMA_HEADER and name not in protocol and type(raw) is bytes:
                # Not valid UTF-8: ignored, as before (only a foreign event's version needs it).
                with contextlib.suppress(UnicodeDecodeError):
                    protocol[name] = raw.decode()
            continue  # an extension attribute of another producer
        else:
            target = user
        if name in target:
            raise EventDecodeError(
                DecodeErrorReason.INVALID_HEADER, f"header {preview(name)} is repeated"
            )
        if type(raw) is bytes:  # what a consumer gives; other byte types are copied first
            try:
                target[name] = raw.decode()
                continue
            except UnicodeDecodeError:
                pass
        target[name] = _header_text(name, raw)
    return protocol, user


def _check_time(text: str) -> datetime:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER, f"ce_time {preview(text)}: {exc}"
        ) from None


def read_envelope(headers: Iterable[tuple[str, bytes]]) -> Envelope:
    """The CloudEvents attributes and user headers of a record in outboxkit's own form (binary
    content mode, every attribute it writes). Raises ``EventDecodeError``."""
    protocol, user = _split_headers(headers)
    return _envelope(protocol, user, None, set())


def read_record(
    headers: Iterable[tuple[str, bytes]],
    value: bytes | None,
    *,
    strict: bool,
    default_versions: Mapping[str, int],
    record_time: datetime | None = None,
) -> tuple[Envelope, bytes | None]:
    """The envelope and the payload's bytes of a record: outboxkit's own form, or, unless
    ``strict``, another producer's CloudEvent (:mod:`outboxkit.schemas.foreign`: structured
    content mode, an id that is not a UUID, no ``schemaversion``, no ``content-type``, no
    ``time``: then ``record_time``, the Kafka record's timestamp, when given).
    Raises ``EventDecodeError``."""
    protocol, user = _split_headers(headers)
    structured = is_structured(protocol.get(WireHeader.CONTENT_TYPE))
    if strict:
        if structured:
            raise EventDecodeError(
                DecodeErrorReason.INVALID_HEADER,
                f"content-type is {STRUCTURED_CONTENT_TYPE!r} (structured content mode): a "
                "registry with strict_envelope=True reads binary content mode only",
            )
        return _envelope(protocol, user, None, set()), value
    forms: set[ForeignForm] = set()
    if structured:
        forms.add(ForeignForm.STRUCTURED)
        attributes, value = read_structured(value)
        protocol = {**attributes, WireHeader.CONTENT_TYPE.value: CONTENT_TYPE}
    elif WireHeader.CONTENT_TYPE not in protocol:
        forms.add(ForeignForm.IMPLIED_CONTENT_TYPE)
    if WireHeader.TIME not in protocol and record_time is not None:
        forms.add(ForeignForm.RECORD_TIME)
        protocol = {**protocol, WireHeader.TIME.value: format_time(record_time)}
    return _envelope(protocol, user, default_versions, forms), value


def _envelope(
    protocol: dict[str, str],
    user: dict[str, str],
    foreign: Mapping[str, int] | None,
    forms: set[ForeignForm],
) -> Envelope:
    """``foreign``: ``None`` reads outboxkit's form only; else the default versions by type of
    the events without ``schemaversion``, and another producer's forms are read too (added to
    ``forms``, those :func:`read_record` found)."""
    required = _REQUIRED if foreign is None else _REQUIRED_OF_ANY_PRODUCER
    missing = [name for name in required if name not in protocol]
    if missing:
        raise EventDecodeError(
            DecodeErrorReason.MISSING_HEADER, f"missing header(s): {', '.join(missing)}"
        )
    invalid = DecodeErrorReason.INVALID_HEADER

    specversion = protocol[WireHeader.SPEC_VERSION]
    if specversion != SPEC_VERSION:
        raise EventDecodeError(
            invalid, f"ce_specversion is {preview(specversion)}, expected {SPEC_VERSION!r}"
        )
    content_type = protocol.get(WireHeader.CONTENT_TYPE, CONTENT_TYPE)
    if content_type.split(";", 1)[0].strip().lower() != CONTENT_TYPE:
        raise EventDecodeError(
            invalid, f"content-type is {preview(content_type)}, expected {CONTENT_TYPE!r}"
        )
    event_type = protocol[WireHeader.TYPE]
    source = protocol[WireHeader.SOURCE]
    id_text = protocol[WireHeader.ID]
    if _CANONICAL_UUID.fullmatch(id_text) is None:
        try:
            id_text = str(UUID(id_text))
        except ValueError:
            if foreign is None:
                raise EventDecodeError(invalid, f"ce_id {preview(id_text)} is not a UUID") from None
            check_foreign_id(id_text)
            id_text = foreign_event_id(source, id_text)
            forms.add(ForeignForm.DERIVED_ID)
    time_text = protocol[WireHeader.TIME]
    canonical_time = _CANONICAL_TIME.fullmatch(time_text) is not None
    if not canonical_time:
        _check_time(time_text)
    version_text = protocol.get(WireHeader.SCHEMA_VERSION)
    if version_text is None and foreign is not None:
        version_text = str(version_of(event_type, protocol.get(DATA_SCHEMA_HEADER), foreign))
        forms.add(ForeignForm.ASSUMED_VERSION)
    if version_text is None or not _SCHEMA_VERSION.fullmatch(version_text):
        raise EventDecodeError(
            invalid, f"ce_schemaversion {preview(version_text or '')} is not an integer >= 1"
        )
    if not event_type:
        raise EventDecodeError(invalid, "ce_type is empty")
    if not source:
        raise EventDecodeError(invalid, "ce_source is empty")
    return Envelope(
        id_text=id_text,
        source=source,
        event_type=event_type,
        time_text=time_text,
        version=int(version_text),
        headers=user,
        canonical_time=canonical_time,
        foreign_forms=frozenset(forms) if forms else _NO_FORMS,
    )


def build_event(
    event_cls: type[Event],
    envelope: Envelope,
    *,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    validator: SchemaValidator | None = None,
    upcast: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Event:
    """Validate the record's key and value into ``event_cls`` (with ``validator``, by default
    the class's own). Raises ``EventDecodeError``. ``upcast`` turns the payload, as read from
    JSON, into one of ``event_cls``' version first (it raises ``EventDecodeError`` itself).

    The envelope attributes are validated together with the payload, as one JSON document
    (not as Python objects), exactly like ``model_validate_json`` of a ``model_dump_json``:
    strict fields and JSON-specific parsing behave the same both ways. A plain payload object is
    validated in place (the envelope spliced in front of its fields, no parse in Python); any
    other value, and any failure, takes the careful path, which says precisely what is wrong."""
    key_text = _record_key(key)
    check = validator if validator is not None else event_cls.__pydantic_validator__
    label = f"{envelope.event_type} v{envelope.version}"
    document = None if upcast else _spliced_document(envelope, key_text, topic, value)
    if document is not None:
        try:
            return _whole(check.validate_json(document), label)
        except ValidationError as exc:
            if not _is_json_error(exc):
                _check_time(envelope.time_text)  # a bad ce_time is the header's fault
                raise EventDecodeError(
                    DecodeErrorReason.INVALID_PAYLOAD, f"{label}: {_describe(exc)}"
                ) from exc
        except Exception as exc:  # a model's own validator may raise anything; keep the contract
            raise _validator_raised(label, exc) from exc
    payload = _record_value(value)
    _check_payload_only(label, payload, "the value")
    if upcast is not None:
        payload = upcast(payload)
        label = f"{label} as v{event_cls.event_version}"
        _check_payload_only(label, payload, "the upcast payload")
    careful = {
        **payload,
        "id": envelope.id_text,
        "key": key_text,
        "topic": topic,
        "occurred_at": _check_time(envelope.time_text).isoformat(),
        "headers": envelope.headers,
    }
    try:
        event = check.validate_json(json.dumps(careful))
    except ValidationError as exc:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_PAYLOAD, f"{label}: {_describe(exc)}"
        ) from exc
    except Exception as exc:  # a model's own validator may raise anything; keep the contract
        raise _validator_raised(label, exc) from exc
    return _whole(event, label)


def _whole(event: Event, label: str) -> Event:
    """Fail closed: a decoded event holds every field its model declares (a validator that
    dropped one would otherwise hand a handler an event missing data the producer wrote)."""
    declared = type(event).__pydantic_fields__
    if len(event.__dict__) == len(declared):
        return event
    missing = ", ".join(sorted(set(declared) - set(event.__dict__)))
    raise EventDecodeError(
        DecodeErrorReason.INVALID_PAYLOAD,
        f"{label}: decoded without the field(s) {missing} its model declares; this is a bug "
        "of outboxkit's decoder, please report it",
    )


def _check_payload_only(label: str, payload: dict[str, Any], what: str) -> None:
    clashes = sorted(ENVELOPE_FIELDS.intersection(payload))
    if clashes:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_PAYLOAD,
            f"{label}: {what} must hold payload fields only, found {', '.join(clashes)}",
        )


def _validator_raised(label: str, exc: Exception) -> EventDecodeError:
    return EventDecodeError(
        DecodeErrorReason.INVALID_PAYLOAD,
        f"{label}: validation raised {type(exc).__name__}: {exc}",
    )


# The value starts with "{" and has at least one member (then "{envelope," + the rest of the
# value is a JSON object exactly when the value is one).
_OBJECT_WITH_MEMBERS = re.compile(rb"[ \t\n\r]*\{[ \t\n\r]*[^ \t\n\r}]")
# Payload keys the splice must not meet: an envelope field (the careful path reports the clash)
# or any \u escape (which could spell one, "\u0069d"; JSON keeps the last of repeated keys).
_SPLICE_STOPS = (*(f'"{name}"'.encode() for name in sorted(ENVELOPE_FIELDS)), b"\\u")


def _spliced_document(
    envelope: Envelope, key_text: str, topic: str, value: bytes | None
) -> bytes | None:
    """The envelope fields followed by the payload's fields, as one JSON object, without
    parsing the payload in Python; ``None`` when the value is not a plain payload object."""
    if type(value) is not bytes:
        return None
    start = _OBJECT_WITH_MEMBERS.match(value)
    if start is None:
        return None
    for stop in _SPLICE_STOPS:
        if stop in value:
            return None
    headers = json.dumps(envelope.headers).encode() if envelope.headers else b"{}"
    brace = value.index(b"{")
    return b"".join(
        (
            b'{"id":"',
            envelope.id_text.encode(),
            b'","key":',
            _json_string(key_text),
            b',"topic":',
            _json_string(topic),
            b',"occurred_at":"',
            _document_time(envelope).encode(),
            b'","headers":',
            headers,
            b",",
            value[brace + 1 :],
        )
    )


def _document_time(envelope: Envelope) -> str:
    return envelope.time_text if envelope.canonical_time else envelope.time.isoformat()


def _json_string(text: str) -> bytes:
    """``text`` as a JSON string: as it is when it needs no escaping (a topic name always, a key
    mostly), else through ``json.dumps``."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return b'"' + text.encode() + b'"'
    return json.dumps(text).encode()


def _is_json_error(exc: ValidationError) -> bool:
    """Whether validation failed because the document is not JSON (the careful path tells
    what is wrong with the value)."""
    return exc.error_count() == 1 and exc.errors(include_url=False)[0]["type"] == "json_invalid"


def _record_key(key: bytes | None) -> str:
    if key is None:
        raise EventDecodeError(DecodeErrorReason.INVALID_KEY, "the record has no key")
    if not isinstance(key, bytes | bytearray | memoryview):
        raise EventDecodeError(DecodeErrorReason.INVALID_KEY, "the record key is not bytes")
    try:
        text = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_KEY, "the record key is not valid UTF-8"
        ) from None
    if not text:
        raise EventDecodeError(DecodeErrorReason.INVALID_KEY, "the record key is empty")
    return text


def _record_value(value: bytes | None) -> dict[str, Any]:
    invalid = DecodeErrorReason.INVALID_VALUE
    if value is None:
        raise EventDecodeError(invalid, "the record has no value (a tombstone?)")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise EventDecodeError(invalid, "the record value is not bytes")
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise EventDecodeError(invalid, "the record value is not valid UTF-8") from None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EventDecodeError(invalid, f"the record value is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise EventDecodeError(
            invalid, f"the record value is a JSON {type(payload).__name__}, not an object"
        )
    return payload


def _describe(exc: ValidationError, limit: int = 3) -> str:
    """Where and why validation failed, without the input values (they may be personal data):
    the first ``limit`` errors and how many more there were. The bounded validators
    (:mod:`outboxkit.schemas.bounded`) keep that count small; an unbounded one is only
    counted past a few hundred errors, never listed."""
    count = exc.error_count()
    if count > _LISTED_ERRORS_AT_MOST:
        return f"{count} validation errors"
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = [
        error["msg"]
        if error["type"] == MORE_UNKNOWN_KEYS
        else f"{'.'.join(str(part) for part in error['loc']) or '(event)'}: {error['msg']}"
        for error in errors[:limit]
    ]
    more = [error for error in errors[limit:] if error["type"] == MORE_UNKNOWN_KEYS]
    parts += [error["msg"] for error in more]
    if len(errors) - limit - len(more) > 0:
        parts.append(f"and {len(errors) - limit - len(more)} more error(s)")
    return "; ".join(parts)


_LISTED_ERRORS_AT_MOST = 500
