"""Events shared by writers, relay, inbox and pipeline. Pure: no I/O.

- :class:`Event`: the base model (envelope + payload) and its class keywords.
- :class:`EventRegistry`: ``(type, version)`` → model; decodes Kafka records.
- :func:`encode` / :class:`EncodedEvent`: the CloudEvents Kafka binding, binary content mode;
  :func:`check_source`: whether a producer's name is a URI-reference, as CloudEvents requires.
- :class:`ForeignForm`: how another producer's CloudEvent the registry read differs from
  outboxkit's own form.
- :func:`partition_for_key`: where Kafka's default partitioner puts a key.
- :func:`check_compatibility`, :class:`CompatibilityMode`, :class:`Snapshot`: which changes of
  an event stay readable by whom, against the JSON Schemas exported earlier (docs/schemas.md).
  They live in :mod:`outboxkit.schemas.compat`, a developer's tool, imported on first use of
  these names: a service, an inbox or a Spark executor never loads it.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from outboxkit.schemas.encoding import check_source, encode
from outboxkit.schemas.event import Event
from outboxkit.schemas.exceptions import (
    DecodeErrorReason,
    EventDecodeError,
    EventDefinitionError,
    RegistryError,
    SchemaError,
)
from outboxkit.schemas.foreign import ForeignForm
from outboxkit.schemas.partitioner import murmur2, partition_for_key, to_positive
from outboxkit.schemas.records import KafkaRecord
from outboxkit.schemas.registry import EventRegistry
from outboxkit.schemas.wire import EncodedEvent, WireHeader

if _TYPE_CHECKING:
    from outboxkit.schemas.compat import (
        CompatibilityMode,
        CompatibilityReport,
        Snapshot,
        check_compatibility,
    )

_COMPAT = frozenset({"CompatibilityMode", "CompatibilityReport", "Snapshot", "check_compatibility"})


def __getattr__(name: str) -> _Any:
    if name in _COMPAT:
        from outboxkit.schemas import compat  # noqa: PLC0415 (the developer's tool, on demand)

        return getattr(compat, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CompatibilityMode",
    "CompatibilityReport",
    "DecodeErrorReason",
    "EncodedEvent",
    "Event",
    "EventDecodeError",
    "EventDefinitionError",
    "EventRegistry",
    "ForeignForm",
    "KafkaRecord",
    "RegistryError",
    "SchemaError",
    "Snapshot",
    "WireHeader",
    "check_compatibility",
    "check_source",
    "encode",
    "murmur2",
    "partition_for_key",
    "to_positive",
]
