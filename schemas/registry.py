"""The :class:`EventRegistry`: which model decodes which ``(type, version)``."""

from collections.abc import Iterator, Sequence
from typing import TypeVar

from pydantic_core import SchemaValidator

from outboxkit.schemas.bounded import bounded_validator
from outboxkit.schemas.event import Event
from outboxkit.schemas.exceptions import DecodeErrorReason, EventDecodeError, RegistryError
from outboxkit.schemas.wire import (
    KafkaRecord,
    build_event,
    preview,
    read_envelope,
    record_size,
)

E = TypeVar("E", bound=Event)


class EventRegistry:
    """Maps ``(event_type, event_version)`` to the model class, and decodes Kafka records.

    ::

        registry = EventRegistry()

        @registry.register
        class OrderPlaced(Event, type="orders.order_placed", topic="orders"): ...

        registry.register(OrderCancelled)
        event = registry.decode_record(consumer_record)
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, int], type[Event]] = {}
        self._validators: dict[type[Event], SchemaValidator] = {}

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

    def __getstate__(self) -> dict[str, object]:
        # The validators are built again where the registry is unpickled (a Spark executor).
        return {**self.__dict__, "_validators": {}}

    def get(self, event_type: str, version: int) -> type[Event] | None:
        """The model registered for ``event_type`` and ``version``, or ``None``."""
        return self._models.get((event_type, version))

    def versions(self, event_type: str) -> tuple[int, ...]:
        """The registered versions of ``event_type``, ascending (empty when unknown)."""
        return tuple(sorted(version for name, version in self._models if name == event_type))

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
    ) -> Event:
        """Decode a Kafka record written by :func:`outboxkit.schemas.encode`.

        Raises :class:`EventDecodeError` — and nothing else — whatever the input; its
        ``reason`` tells why. ``ce_source`` is checked but not part of the returned event.

        The cost is bounded by the input's size, whatever its shape: a record over
        ``max_bytes`` (key, value and headers) is rejected before anything is parsed, and
        validation reports at most a few errors per collection and per model
        (:mod:`outboxkit.schemas.bounded`), never one per bad element or unknown key.
        """
        if max_bytes is not None:
            size = record_size(key, value, headers)
            if size > max_bytes:
                raise EventDecodeError(
                    DecodeErrorReason.TOO_LARGE,
                    f"the record has {size} bytes, over the decoder's limit of {max_bytes}",
                )
        envelope = read_envelope(headers)
        event_cls = self._resolve(envelope.event_type, envelope.version)
        return build_event(
            event_cls,
            envelope,
            topic=topic,
            key=key,
            value=value,
            validator=self._validator(event_cls),
        )

    def decode_record(self, record: KafkaRecord, *, max_bytes: int | None = None) -> Event:
        """:meth:`decode` a consumed record (aiokafka ``ConsumerRecord``…), topic included."""
        return self.decode(
            topic=record.topic,
            key=record.key,
            value=record.value,
            headers=record.headers,
            max_bytes=max_bytes,
        )

    def _validator(self, event_cls: type[Event]) -> SchemaValidator:
        validator = self._validators.get(event_cls)
        if validator is None:
            validator = self._validators[event_cls] = bounded_validator(event_cls)
        return validator

    def _resolve(self, event_type: str, version: int) -> type[Event]:
        event_cls = self.get(event_type, version)
        if event_cls is not None:
            return event_cls
        known = self.versions(event_type)
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
