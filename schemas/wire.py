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
other headers             ``event.headers``, one Kafka header each (UTF-8 values)
``traceparent``           the writer's current span (W3C Trace Context) when the process uses
                          OpenTelemetry and ``event.headers`` has none (``core/tracing.py``)
========================  =====================================================================

The topic is the record's topic. Decoding lives in
:meth:`outboxkit.schemas.EventRegistry.decode`, which uses :func:`read_envelope` and
:func:`build_event` below; both raise only :class:`EventDecodeError`.
"""

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from typing import Any, Protocol
from uuid import UUID

from pydantic import ValidationError

from outboxkit.core.tracing import trace_headers
from outboxkit.schemas.event import ENVELOPE_FIELDS, Event, is_reserved_header
from outboxkit.schemas.exceptions import DecodeErrorReason, EventDecodeError, SchemaError

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


class KafkaRecord(Protocol):
    """What the decoder needs of a consumed record; aiokafka's ``ConsumerRecord`` fits."""

    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Envelope:
    """The CloudEvents attributes read from a record's headers."""

    id: UUID
    source: str
    event_type: str
    time: datetime
    version: int
    headers: dict[str, str]


def encode(event: Event, *, source: str) -> EncodedEvent:
    """The Kafka record for ``event``; ``source`` identifies the producer (``ce_source``)."""
    if not isinstance(source, str) or not source:
        raise SchemaError("source must be a non-empty string (a URI-reference naming the producer)")
    headers: list[tuple[str, bytes]] = [
        (WireHeader.SPEC_VERSION.value, SPEC_VERSION.encode()),
        (WireHeader.ID.value, str(event.id).encode()),
        (WireHeader.SOURCE.value, source.encode()),
        (WireHeader.TYPE.value, event.event_type.encode()),
        (WireHeader.TIME.value, format_time(event.occurred_at).encode()),
        (WireHeader.SCHEMA_VERSION.value, str(event.event_version).encode()),
        (WireHeader.CONTENT_TYPE.value, CONTENT_TYPE.encode()),
    ]
    headers.extend((name, value.encode()) for name, value in event.headers.items())
    # The writer's trace context (OpenTelemetry, when the process uses it): every writer calls
    # encode, so the PostgreSQL, in-memory and MongoDB outboxes all carry it to the consumer.
    headers.extend(
        (name, value.encode())
        for name, value in trace_headers().items()
        if name not in event.headers
    )
    payload = event.model_dump_json(include=set(event.event_payload_fields), by_alias=True)
    return EncodedEvent(
        topic=event.topic,
        key=event.key.encode(),
        value=payload.encode(),
        headers=tuple(headers),
    )


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
_SCHEMA_VERSION = re.compile(r"[1-9][0-9]{0,9}", re.ASCII)


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
    """Protocol headers and user headers, both decoded; unknown ``ce_*`` headers are ignored."""
    protocol: dict[str, str] = {}
    user: dict[str, str] = {}
    try:
        items = list(headers)
    except Exception as exc:  # any iterable the caller passed; report, never leak
        raise EventDecodeError(
            DecodeErrorReason.INVALID_HEADER, "headers are not iterable"
        ) from exc
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
            raise EventDecodeError(
                DecodeErrorReason.INVALID_HEADER, "a header is not a (str, bytes) pair"
            )
        name, raw = item
        if is_reserved_header(name):
            if name not in _REQUIRED:
                continue  # an extension attribute of another producer
            target = protocol
        else:
            target = user
        if name in target:
            raise EventDecodeError(
                DecodeErrorReason.INVALID_HEADER, f"header {preview(name)} is repeated"
            )
        target[name] = _header_text(name, raw)
    return protocol, user


def read_envelope(headers: Iterable[tuple[str, bytes]]) -> Envelope:
    """The CloudEvents attributes and user headers of a record. Raises ``EventDecodeError``."""
    protocol, user = _split_headers(headers)
    missing = [name for name in _REQUIRED if name not in protocol]
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
    content_type = protocol[WireHeader.CONTENT_TYPE]
    if content_type.split(";", 1)[0].strip().lower() != CONTENT_TYPE:
        raise EventDecodeError(
            invalid, f"content-type is {preview(content_type)}, expected {CONTENT_TYPE!r}"
        )
    try:
        event_id = UUID(protocol[WireHeader.ID])
    except ValueError:
        raise EventDecodeError(
            invalid, f"ce_id {preview(protocol[WireHeader.ID])} is not a UUID"
        ) from None
    try:
        time = parse_time(protocol[WireHeader.TIME])
    except ValueError as exc:
        raise EventDecodeError(
            invalid, f"ce_time {preview(protocol[WireHeader.TIME])}: {exc}"
        ) from None
    version_text = protocol[WireHeader.SCHEMA_VERSION]
    if not _SCHEMA_VERSION.fullmatch(version_text):
        raise EventDecodeError(
            invalid, f"ce_schemaversion {preview(version_text)} is not an integer >= 1"
        )
    event_type = protocol[WireHeader.TYPE]
    source = protocol[WireHeader.SOURCE]
    if not event_type:
        raise EventDecodeError(invalid, "ce_type is empty")
    if not source:
        raise EventDecodeError(invalid, "ce_source is empty")
    return Envelope(
        id=event_id,
        source=source,
        event_type=event_type,
        time=time,
        version=int(version_text),
        headers=user,
    )


def build_event(
    event_cls: type[Event],
    envelope: Envelope,
    *,
    topic: str,
    key: bytes | None,
    value: bytes | None,
) -> Event:
    """Validate the record's key and value into ``event_cls``. Raises ``EventDecodeError``."""
    key_text = _record_key(key)
    payload = _record_value(value)
    label = f"{envelope.event_type} v{envelope.version}"
    clashes = sorted(ENVELOPE_FIELDS.intersection(payload))
    if clashes:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_PAYLOAD,
            f"{label}: the value must hold payload fields only, found {', '.join(clashes)}",
        )
    document = {
        **payload,
        "id": str(envelope.id),
        "key": key_text,
        "topic": topic,
        "occurred_at": envelope.time.isoformat(),
        "headers": envelope.headers,
    }
    try:
        # Validated as JSON (not as Python objects), exactly like model_validate_json of a
        # model_dump_json: strict fields and JSON-specific parsing behave the same both ways.
        return event_cls.model_validate_json(json.dumps(document))
    except ValidationError as exc:
        raise EventDecodeError(
            DecodeErrorReason.INVALID_PAYLOAD, f"{label}: {_describe(exc)}"
        ) from exc
    except Exception as exc:  # a model's own validator may raise anything; keep the contract
        raise EventDecodeError(
            DecodeErrorReason.INVALID_PAYLOAD,
            f"{label}: validation raised {type(exc).__name__}: {exc}",
        ) from exc


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
    """Where and why validation failed, without the input values (they may be personal data)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = [
        f"{'.'.join(str(part) for part in error['loc']) or '(event)'}: {error['msg']}"
        for error in errors[:limit]
    ]
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more error(s)")
    return "; ".join(parts)
