"""The :class:`EventRegistry`: which model decodes which ``(type, version)``, and which
upcasters turn an older version's payload into a newer one's."""

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

import structlog
from pydantic_core import SchemaValidator

from outboxkit.schemas.bounded import bounded_validator, collecting_unknown_fields
from outboxkit.schemas.event import Event
from outboxkit.schemas.exceptions import DecodeErrorReason, EventDecodeError, RegistryError
from outboxkit.schemas.foreign import ForeignForm
from outboxkit.schemas.records import KafkaRecord, record_size, record_timestamp
from outboxkit.schemas.wire import build_event, preview, read_record

E = TypeVar("E", bound=Event)

#: A payload of one version (a dict, as read from JSON) → the payload of a newer version.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
U = TypeVar("U", bound=Upcaster)

logger = structlog.get_logger("outboxkit.schemas")


class EventRegistry:
    """Maps ``(event_type, event_version)`` to the model class, and decodes Kafka records.

    ::

        registry = EventRegistry()

        @registry.register
        class OrderPlaced(Event, type="orders.order_placed", topic="orders"): ...

        registry.register(OrderCancelled)
        event = registry.decode_record(consumer_record)

    Decoding is tolerant: payload fields a model does not declare are ignored (unless the
    class says ``strict_reader=True``), named once per type and version in the log and to
    the caller that asks (``unknown_fields=``). Records of an older version are read as a
    newer model through :meth:`upcaster` functions (docs/schemas.md).

    It reads the CloudEvents other producers write too (a service in another language with
    its CloudEvents SDK: structured content mode, an id that is not a UUID, no
    ``schemaversion``: :mod:`outboxkit.schemas.foreign`), unless ``strict_envelope=True``:
    then only records in the form :func:`~outboxkit.schemas.encode` writes are read, the
    others refused (``missing_header``, ``invalid_header``). The inbox and the Spark pipeline
    decode with the registry they are given, so both read the same records the same way.
    """

    def __init__(self, *, strict_envelope: bool = False) -> None:
        #: Whether only records in outboxkit's own form are read.
        self.strict_envelope = strict_envelope
        #: Event type → the version of its records that carry none (1 when not set).
        self._assumed_versions: dict[str, int] = {}
        self._models: dict[tuple[str, int], type[Event]] = {}
        self._validators: dict[type[Event], SchemaValidator] = {}
        #: ``(type, from_version)`` → (the version it produces, the function).
        self._upcasters: dict[tuple[str, int], tuple[int, Upcaster]] = {}
        self._unknown_logged: set[tuple[str, int]] = set()
        self._assumed_logged: set[tuple[str, int]] = set()

    def register(self, event_cls: type[E]) -> type[E]:
        """Register ``event_cls`` under its type and version; returns it (usable as a decorator).

        Registering the same class again does nothing; another class under the same type and
        version raises :class:`RegistryError`.
        """
        if not (isinstance(event_cls, type) and issubclass(event_cls, Event)):
            raise RegistryError(f"{event_cls!r} is not a subclass of Event")
        if event_cls is Event:
            raise RegistryError("register a subclass of Event, not Event itself")
        slot = (event_cls.event_type, event_cls.event_version)
        known = self._models.setdefault(slot, event_cls)
        if known is not event_cls:
            raise RegistryError(
                f"{slot[0]!r} version {slot[1]} is already registered to "
                f"{known.__module__}.{known.__qualname__}; cannot register "
                f"{event_cls.__module__}.{event_cls.__qualname__}"
            )
        return event_cls

    def upcaster(self, target: type[Event], *, from_version: int) -> Callable[[U], U]:
        """Register the decorated function as the way from a ``from_version`` payload of
        ``target``'s type to a ``target`` payload (dicts, as read from JSON)::

            @registry.upcaster(OrderPlacedV2, from_version=1)
            def _(payload: dict[str, Any]) -> dict[str, Any]:
                return {**payload, "currency": "EUR"}

        Upcasters chain (1 → 2 → 3) until a version with a registered model; a record of an
        upcast version is read as that model even where a model of its own version is
        registered too (which stays usable for writing). One upcaster per type and version.
        """
        if not (isinstance(target, type) and issubclass(target, Event)) or target is Event:
            raise RegistryError(f"{target!r} is not a subclass of Event")
        if isinstance(from_version, bool) or not isinstance(from_version, int):
            raise RegistryError(f"from_version must be an int, got {from_version!r}")
        if not 1 <= from_version < target.event_version:
            raise RegistryError(
                f"an upcaster to {target.event_type!r} version {target.event_version} comes "
                f"from an older version (1 to {target.event_version - 1}), not {from_version}"
            )
        slot = (target.event_type, from_version)

        def register(function: U) -> U:
            known = self._upcasters.get(slot)
            if known is not None and known[1] is not function:
                raise RegistryError(
                    f"{slot[0]!r} version {from_version} already has an upcaster "
                    f"(to version {known[0]}): {_name(known[1])}"
                )
            self._upcasters[slot] = (target.event_version, function)
            return function

        return register

    def assume_version(self, event_type: str, version: int) -> None:
        """Read a record of ``event_type`` that says no version (no ``ce_schemaversion``, no
        version at the end of its ``dataschema``: another producer's) as ``version`` (by
        default 1). Ignored with ``strict_envelope=True``, which refuses such records."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RegistryError(f"a version is an int >= 1, got {version!r}")
        self._assumed_versions[event_type] = version

    def __getstate__(self) -> dict[str, object]:
        # The validators are built again where the registry is unpickled (a Spark executor).
        return {**self.__dict__, "_validators": {}}

    def get(self, event_type: str, version: int) -> type[Event] | None:
        """The model registered for ``event_type`` and ``version``, or ``None``."""
        return self._models.get((event_type, version))

    def versions(self, event_type: str) -> tuple[int, ...]:
        """The registered versions of ``event_type``, ascending (empty when unknown)."""
        return tuple(sorted(version for name, version in self._models if name == event_type))

    def readable_versions(self, event_type: str) -> tuple[int, ...]:
        """The versions of ``event_type`` this registry decodes, ascending: those with a
        registered model, and those an upcaster chain leads to one from."""
        candidates = {
            version for name, version in [*self._models, *self._upcasters] if name == event_type
        }
        return tuple(sorted(v for v in candidates if self._chain(event_type, v)[0] is not None))

    def upcast_versions(self, event_type: str) -> dict[int, type[Event]]:
        """The versions of ``event_type`` read through upcasters → the model they end in."""
        chains = {
            version: self._chain(event_type, version)[0]
            for name, version in self._upcasters
            if name == event_type
        }
        return {version: model for version, model in sorted(chains.items()) if model is not None}

    def __iter__(self) -> Iterator[type[Event]]:
        """The registered models, ordered by type then version."""
        return iter([self._models[slot] for slot in sorted(self._models)])

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, event_cls: object) -> bool:
        if not (isinstance(event_cls, type) and issubclass(event_cls, Event)):
            return False
        return self.get(event_cls.event_type, event_cls.event_version) is event_cls

    def decode(
        self,
        *,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        max_bytes: int | None = None,
        unknown_fields: list[str] | None = None,
        record_time: datetime | None = None,
        foreign_forms: list[ForeignForm] | None = None,
    ) -> Event:
        """Decode a Kafka record written by :func:`outboxkit.schemas.encode` (or, unless
        ``strict_envelope``, another producer's CloudEvent: the class's docstring).

        Raises :class:`EventDecodeError` — and nothing else — whatever the input; its
        ``reason`` tells why. ``ce_source`` is checked but not part of the returned event.
        The payload fields the model does not know are ignored and appended to
        ``unknown_fields`` when given (nested models' fields by their own name).

        The cost is bounded by the input's size, whatever its shape: a record over
        ``max_bytes`` (key, value and headers) is rejected before anything is parsed, and
        validation reports at most a few errors per collection and per model
        (:mod:`outboxkit.schemas.bounded`), never one per bad element or unknown key.

        ``record_time`` (the Kafka record's timestamp) is the time of another producer's event
        that has no ``time`` attribute (CloudEvents makes it optional; outboxkit's events always
        have one). How another producer's event differs from outboxkit's form is appended to
        ``foreign_forms`` when given (:class:`~outboxkit.schemas.foreign.ForeignForm`, in
        their order there; none for outboxkit's own records).
        """
        if max_bytes is not None:
            size = record_size(key, value, headers)
            if size > max_bytes:
                raise EventDecodeError(
                    DecodeErrorReason.TOO_LARGE,
                    f"the record has {size} bytes, over the decoder's limit of {max_bytes}",
                )
        envelope, value = read_record(
            headers,
            value,
            strict=self.strict_envelope,
            default_versions=self._assumed_versions,
            record_time=record_time,
        )
        event_cls, steps = self._resolve(envelope.event_type, envelope.version)
        if ForeignForm.ASSUMED_VERSION in envelope.foreign_forms:
            self._assumed(envelope.event_type, envelope.version)
        with collecting_unknown_fields() as unknown:
            event = build_event(
                event_cls,
                envelope,
                topic=topic,
                key=key,
                value=value,
                validator=self._validator(event_cls),
                upcast=_upcast(envelope.event_type, steps) if steps else None,
            )
        if unknown:
            self._ignored(event_cls, unknown)
            if unknown_fields is not None:
                unknown_fields.extend(unknown)
        if foreign_forms is not None and envelope.foreign_forms:
            foreign_forms.extend(f for f in ForeignForm if f in envelope.foreign_forms)
        return event

    def decode_record(
        self,
        record: KafkaRecord,
        *,
        max_bytes: int | None = None,
        unknown_fields: list[str] | None = None,
        foreign_forms: list[ForeignForm] | None = None,
    ) -> Event:
        """:meth:`decode` a consumed record (aiokafka ``ConsumerRecord``…), topic included, and
        its timestamp (milliseconds since the epoch, aiokafka's ``timestamp``) if it has one."""
        return self.decode(
            topic=record.topic,
            key=record.key,
            value=record.value,
            headers=record.headers,
            max_bytes=max_bytes,
            unknown_fields=unknown_fields,
            record_time=record_timestamp(record),
            foreign_forms=foreign_forms,
        )

    def _validator(self, event_cls: type[Event]) -> SchemaValidator:
        validator = self._validators.get(event_cls)
        if validator is None:
            validator = self._validators[event_cls] = bounded_validator(
                event_cls, tolerant=not event_cls.event_strict_reader
            )
        return validator

    def _assumed(self, event_type: str, version: int) -> None:
        if (event_type, version) not in self._assumed_logged:
            self._assumed_logged.add((event_type, version))
            logger.info(
                "read records without ce_schemaversion (another producer's) as this version: "
                "the one their dataschema names, else the type's default "
                "(EventRegistry.assume_version); logged once per type and version",
                event_type=event_type,
                event_version=version,
            )

    def _ignored(self, event_cls: type[Event], names: list[str]) -> None:
        slot = (event_cls.event_type, event_cls.event_version)
        if slot not in self._unknown_logged:
            self._unknown_logged.add(slot)
            logger.info(
                "ignored payload fields this model does not declare (a newer producer's?); "
                "logged once per type and version",
                event_type=slot[0],
                event_version=slot[1],
                fields=_few(names),
                model=_name(event_cls),
            )

    def _chain(
        self, event_type: str, version: int
    ) -> tuple[type[Event] | None, list[tuple[int, int, Upcaster]]]:
        """The model a record of ``version`` is read as (``None``: none), and the upcasters
        from ``version`` to it: (from, to, function) each."""
        steps: list[tuple[int, int, Upcaster]] = []
        while (event_type, version) in self._upcasters:  # ends: each step goes up
            target, function = self._upcasters[(event_type, version)]
            steps.append((version, target, function))
            version = target
        return self.get(event_type, version), steps

    def _resolve(
        self, event_type: str, version: int
    ) -> tuple[type[Event], list[tuple[int, int, Upcaster]]]:
        event_cls, steps = self._chain(event_type, version)
        if event_cls is not None:
            return event_cls, steps
        known = self.readable_versions(event_type)
        if not known:
            raise EventDecodeError(
                DecodeErrorReason.UNKNOWN_TYPE,
                f"event type {preview(event_type)} is not registered",
            )
        raise EventDecodeError(
            DecodeErrorReason.UNSUPPORTED_VERSION,
            f"event type {preview(event_type)} has no version {version}; "
            f"known versions: {', '.join(map(str, known))}",
        )


def _upcast(
    event_type: str, steps: list[tuple[int, int, Upcaster]]
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """One function applying ``steps`` in order; a step that raises or returns something other
    than a dict ends in an :class:`EventDecodeError` naming it."""

    def upcast(payload: dict[str, Any]) -> dict[str, Any]:
        for source, target, function in steps:
            where = f"{event_type} v{source}: upcaster to v{target} ({_name(function)})"
            try:
                payload = function(payload)
            except Exception as exc:  # a user's function; keep the decoder's contract
                raise EventDecodeError(
                    DecodeErrorReason.INVALID_PAYLOAD,
                    f"{where} raised {type(exc).__name__}: {exc}",
                ) from exc
            if not isinstance(payload, dict):
                raise EventDecodeError(
                    DecodeErrorReason.INVALID_PAYLOAD,
                    f"{where} returned a {type(payload).__name__}, not a dict",
                )
        return payload

    return upcast


def _few(names: list[str], shown: int = 10) -> str:
    """The first ``shown`` distinct names, sorted, and how many more (a hostile record can
    hold thousands)."""
    distinct = sorted(set(names))
    more = f" and {len(distinct) - shown} more" if len(distinct) > shown else ""
    return ", ".join(distinct[:shown]) + more


def _name(thing: Any) -> str:
    return f"{getattr(thing, '__module__', '?')}.{getattr(thing, '__qualname__', repr(thing))}"
