"""The :class:`Event` base model: an envelope (id, key, topic, time, headers) plus a payload.

A service declares one subclass per event and version; the metadata goes in the class keywords::

    class OrderPlaced(Event, type="orders.order_placed", version=2, topic="orders",
                      key_field="customer_id"):
        order_id: str
        customer_id: str
        amount: Decimal

    event = OrderPlaced(order_id="o-1", customer_id="c-7", amount=Decimal("9.90"))
    event.topic, event.key          # ("orders", "c-7")
    OrderPlaced.event_version       # 2
"""

import functools
import inspect
import re
import urllib.parse
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self, Unpack
from uuid import UUID, uuid4

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from outboxkit.schemas.exceptions import EventDefinitionError

ENVELOPE_FIELDS = frozenset({"id", "key", "topic", "occurred_at", "headers"})
"""The fields every event has; all other fields of a subclass are its payload."""

# An absolute URI: a scheme, then anything printable (RFC 3986 section 3.1).
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+\Z")

# Kafka's own rule for topic names (``org.apache.kafka.common.internals.Topic``).
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@functools.lru_cache(maxsize=4096)
def is_valid_topic(name: str) -> bool:
    """Whether Kafka accepts ``name`` as a topic name (cached: a consumer sees few names)."""
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in {".", ".."}


def is_reserved_header(name: str) -> bool:
    """Whether a Kafka header name belongs to the wire protocol (``ce_*``, ``content-type``)."""
    lowered = name.lower()
    return lowered.startswith("ce_") or lowered == "content-type"


def _require_utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be encodable as UTF-8 (no lone surrogates)") from None
    return text


def _require_topic(name: str) -> str:
    if not is_valid_topic(name):
        raise ValueError(
            f"{name!r} is not a valid Kafka topic name (1-249 of a-z A-Z 0-9 . _ -, not . or ..)"
        )
    return name


def _require_user_header_name(name: str) -> str:
    if is_reserved_header(name):
        raise ValueError(f"header name {name!r} is reserved for the wire protocol")
    return name


_Utf8Str = Annotated[str, AfterValidator(_require_utf8)]
_Topic = Annotated[str, AfterValidator(_require_topic)]
_HeaderName = Annotated[_Utf8Str, AfterValidator(_require_user_header_name)]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every event. Immutable; unknown fields are rejected when constructing one (and,
    when decoding, ignored unless the class says ``strict_reader=True``).

    Class keywords (each optional):

    ``type``
        Stable name of the event on the wire (``ce_type``). Defaults to the class name; not
        inherited, so a subclass never silently shares its parent's name.
    ``version``
        Schema version, an int >= 1 (``ce_schemaversion``). Defaults to 1; not inherited.
    ``topic``
        Default Kafka topic for instances that do not pass ``topic=``. Inherited.
    ``key_field``
        Payload field whose value becomes ``key`` when ``key=`` is not passed: its JSON form,
        which must be a string (str, UUID, Decimal, str enum…) or a number. Inherited.
    ``dataschema``
        URI of this type and version's schema, sent as ``ce_dataschema`` (the CloudEvents
        attribute). Defaults to ``urn:outboxkit:schema:<type>:<version>``, which names the file
        ``outboxkit schemas export`` writes; set it when a registry serves your schemas. Not
        inherited.
    ``strict_reader``
        ``True`` to reject, when decoding, payload fields this model does not declare. By
        default a reader is tolerant: it ignores them (and counts them), so a producer may add a
        field before its consumers know it (docs/schemas.md). Writing is always strict: a
        model rejects unknown fields when constructed. Inherited.

    They are readable from the class and from instances as ``event_type``, ``event_version``,
    ``event_topic``, ``event_key_field``, ``event_dataschema`` and ``event_strict_reader``
    (assigning those class attributes in the class body works too); ``event_payload_fields``
    names the payload fields.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_type: ClassVar[str] = "Event"
    event_version: ClassVar[int] = 1
    event_topic: ClassVar[str | None] = None
    event_key_field: ClassVar[str | None] = None
    event_dataschema: ClassVar[str] = "urn:outboxkit:schema:Event:1"
    event_strict_reader: ClassVar[bool] = False
    event_payload_fields: ClassVar[tuple[str, ...]] = ()

    id: UUID = Field(default_factory=uuid4, description="Idempotency key of the event.")
    key: _Utf8Str = Field(
        default="",
        min_length=1,
        description="Kafka partition key; derived from the class's key_field when omitted.",
    )
    topic: _Topic = Field(
        default="",
        description="Kafka topic; the class's default topic when omitted.",
    )
    occurred_at: AwareDatetime = Field(
        default_factory=_utcnow, description="When the event happened; stored in UTC."
    )
    headers: dict[_HeaderName, _Utf8Str] = Field(
        default_factory=dict, description="Free-form headers, sent as Kafka headers."
    )

    def __init_subclass__(
        cls,
        *,
        type: str | None = None,
        version: int | None = None,
        topic: str | None = None,
        key_field: str | None = None,
        dataschema: str | None = None,
        strict_reader: bool | None = None,
        **kwargs: Unpack[ConfigDict],
    ) -> None:
        try:
            super().__init_subclass__(**kwargs)
        except TypeError as exc:
            if not kwargs:
                raise
            raise EventDefinitionError(
                f"{cls.__name__}: unknown class keyword(s) {', '.join(map(repr, kwargs))}; "
                "Event takes type, version, topic, key_field, dataschema, strict_reader and "
                "pydantic config keys"
            ) from exc
        for name in inspect.get_annotations(cls):
            if name in ENVELOPE_FIELDS or name in _RESERVED_NAMES:
                raise EventDefinitionError(
                    f"{cls.__name__}: {name!r} is a reserved name of Event and cannot be declared"
                )

        event_type = type if type is not None else cls.__dict__.get("event_type", cls.__name__)
        if not isinstance(event_type, str) or not event_type.strip():
            raise EventDefinitionError(f"{cls.__name__}: type must be a non-empty string")
        cls.event_type = event_type

        event_version = version if version is not None else cls.__dict__.get("event_version", 1)
        if not isinstance(event_version, int) or isinstance(event_version, bool):
            raise EventDefinitionError(f"{cls.__name__}: version must be an int")
        if event_version < 1:
            raise EventDefinitionError(f"{cls.__name__}: version must be >= 1, got {event_version}")
        cls.event_version = event_version

        if dataschema is None:
            dataschema = cls.__dict__.get("event_dataschema")
        if dataschema is None:
            # Any type name is allowed; the URI carries it percent-encoded.
            name = urllib.parse.quote(event_type, safe="._-~")
            dataschema = f"urn:outboxkit:schema:{name}:{event_version}"
        if not isinstance(dataschema, str) or not _URI.match(dataschema):
            raise EventDefinitionError(
                f"{cls.__name__}: dataschema must be an absolute URI (scheme:...), got "
                f"{dataschema!r}"
            )
        cls.event_dataschema = dataschema

        if topic is not None:
            cls.event_topic = topic
        if key_field is not None:
            cls.event_key_field = key_field
        if strict_reader is not None:
            if not isinstance(strict_reader, bool):
                raise EventDefinitionError(f"{cls.__name__}: strict_reader must be a bool")
            cls.event_strict_reader = strict_reader
        default_topic = cls.event_topic
        if default_topic is not None and not (
            isinstance(default_topic, str) and is_valid_topic(default_topic)
        ):
            raise EventDefinitionError(
                f"{cls.__name__}: {default_topic!r} is not a valid topic name"
            )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Runs once the fields are known (``__init_subclass__`` runs before).
        super().__pydantic_init_subclass__(**kwargs)
        cls.event_payload_fields = tuple(
            name for name in cls.model_fields if name not in ENVELOPE_FIELDS
        )
        for name in cls.event_payload_fields:
            info = cls.model_fields[name]
            wire = {info.alias, info.serialization_alias, info.validation_alias} & ENVELOPE_FIELDS
            if wire:
                raise EventDefinitionError(
                    f"{cls.__name__}: field {name!r} has the alias {wire.pop()!r}, an envelope "
                    "field's name: a payload field cannot be written under it"
                )
        if cls.event_key_field is not None and cls.event_key_field not in cls.event_payload_fields:
            raise EventDefinitionError(
                f"{cls.__name__}: key_field {cls.event_key_field!r} is not a payload field"
            )

    @field_validator("occurred_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("datetime is out of range once converted to UTC") from None

    @model_validator(mode="after")
    def _fill_topic_and_key(self) -> Self:
        # ``object.__setattr__``: the model is frozen, and these are its own defaults being set.
        if "topic" not in self.model_fields_set:
            if self.event_topic is None:
                raise ValueError(
                    f"{type(self).__name__} has no default topic: pass topic=... or declare "
                    f"the class with a topic (class {type(self).__name__}(Event, topic=...))"
                )
            object.__setattr__(self, "topic", self.event_topic)
            self.model_fields_set.add("topic")
        if "key" not in self.model_fields_set:
            object.__setattr__(self, "key", self._derive_key())
            self.model_fields_set.add("key")
        return self

    def _derive_key(self) -> str:
        field = self.event_key_field
        if field is None:
            raise ValueError(
                f"key is required: pass key=... or declare {type(self).__name__} with a key_field"
            )
        value = self.model_dump(mode="json", include={field})[field]
        if isinstance(value, str):
            key = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            key = str(value)
        else:
            raise ValueError(
                f"key_field {field!r} must hold a string or a number to derive the key, "
                f"got {value!r}; pass key=..."
            )
        if not key:
            raise ValueError(f"key_field {field!r} is empty; the key must not be empty")
        return key

    def __hash__(self) -> int:
        # Equal events have equal ids; pydantic's default would hash every field (dicts fail).
        return hash((type(self), self.id))

    def event_payload(self, *, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """The payload fields (those declared by subclasses) as a dict."""
        return self.model_dump(mode=mode, include=set(self.event_payload_fields))


_RESERVED_NAMES = frozenset(name for name in vars(Event) if name.startswith("event_"))
