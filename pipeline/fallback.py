"""The Python pass: the registry itself decides the records the JVM left undecided.

Spark SQL cannot run Pydantic: lax-mode coercions (``"12"`` → 12, ``1e3`` → Decimal, every ISO
8601 variant…), user validators, and the exact order in which the Python decoder checks the
envelope (a malformed header before a missing one…) are only exact when the registry runs. So
the JVM accepts what it can prove valid (:mod:`outboxkit.pipeline.payload`) and rejects only
what it can prove invalid (:mod:`outboxkit.pipeline.envelope`); every other record goes
through :meth:`outboxkit.schemas.EventRegistry.decode` here — garbage, and valid events that
are not written canonically.

It is one vectorised Arrow UDF in the decoding projection: Spark sends it every row of a
micro-batch, but a decided row's inputs are nulls (a bit in a validity bitmap), and only the
undecided ones are turned into Python objects. On a stream written by outboxkit that is no
row at all, so no Python runs per event.

:func:`decode_rows` needs no SparkSession: it is unit-testable on Arrow arrays.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from typing import Any
from uuid import UUID

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    DataType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from outboxkit.pipeline.exceptions import SchemaMappingError
from outboxkit.pipeline.schema import spark_schema
from outboxkit.schemas import Event, EventDecodeError, EventRegistry

#: Error reason of an event that decodes but does not fit its Spark column (e.g. a Decimal with
#: more digits than the column's precision). The other reasons are ``DecodeErrorReason`` values.
UNREPRESENTABLE = "unrepresentable"

#: Columns every decoded row has (``occurred_at`` is the event time; null when quarantined).
ENVELOPE_COLUMNS = ("event_id", "event_type", "event_version", "event_key", "occurred_at")
#: The Kafka source's columns, kept (``value`` and ``headers`` only on quarantined rows).
RAW_COLUMNS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")
#: The error, named like the inbox's dead-letter headers (``outboxkit-error-reason`` …).
ERROR_COLUMNS = ("error_reason", "error_message", "error_type")
#: Longest error message kept.
MESSAGE_LIMIT = 4000


def event_column(model: type[Event]) -> str:
    """Column of the decoded DataFrame that holds ``model``'s events, e.g.
    ``shop_order_placed_v1`` for type ``shop.order_placed`` version 1."""
    return re.sub(r"\W", "_", f"{model.event_type}_v{model.event_version}", flags=re.ASCII)


def model_columns(registry: EventRegistry) -> dict[str, type[Event]]:
    """Event column name → model, in registry order; two models on one name fail."""
    columns: dict[str, type[Event]] = {}
    for model in registry:
        name = event_column(model)
        if name in columns or name in (*ENVELOPE_COLUMNS, *RAW_COLUMNS, *ERROR_COLUMNS):
            other = columns.get(name)
            raise SchemaMappingError(
                f"{model.event_type} v{model.event_version} and "
                f"{other.event_type if other else 'a fixed column'} both map to column {name!r}"
            )
        columns[name] = model
    return columns


def result_schema(registry: EventRegistry) -> StructType:
    """What decoding gives for one record: envelope, one struct per model, and the error."""
    return StructType(
        [
            StructField("event_id", StringType()),
            StructField("event_type", StringType()),
            StructField("event_version", IntegerType()),
            StructField("event_key", StringType()),
            StructField("occurred_at", TimestampType()),
            *(
                StructField(name, nullable(spark_schema(model)))
                for name, model in model_columns(registry).items()
            ),
            StructField("error_reason", StringType()),
            StructField("error_message", StringType()),
            StructField("error_type", StringType()),
        ]
    )


def nullable(data_type: DataType) -> DataType:
    """``data_type`` with every nested field, element and value nullable: the decoded columns
    are null on the rows of other models, and both passes must give the same type."""
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, nullable(f.dataType)) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(nullable(data_type.elementType), containsNull=True)
    if isinstance(data_type, MapType):
        return MapType(data_type.keyType, nullable(data_type.valueType), valueContainsNull=True)
    return data_type


class PythonDecoder:
    """Arrow UDF body: decode the rows whose ``undecided`` flag is true with the registry.

    Picklable (the registry's models are pickled by reference). Returns one struct per row
    (:func:`result_schema`); null for rows that were not undecided.
    """

    def __init__(self, registry: EventRegistry) -> None:
        self.registry = registry
        self.schema = result_schema(registry)
        self._columns = {
            (m.event_type, m.event_version): n for n, m in model_columns(registry).items()
        }
        self._arrow: pa.StructType | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrow": None}

    @property
    def arrow_type(self) -> pa.StructType:
        if self._arrow is None:
            self._arrow = to_arrow_type(self.schema, timezone="UTC")
        return self._arrow

    def function(self) -> Callable[..., pa.Array]:
        """The UDF's function (Spark reads its type hints: Arrow arrays in, an array out)."""
        decoder = self

        def outboxkit_registry_decode(  # noqa: PLR0917 (the UDF's columns, in order)
            undecided: pa.Array,
            key: pa.Array,
            value: pa.Array,
            headers: pa.Array,
            topic: pa.Array,
            timestamp: pa.Array,
        ) -> pa.Array:
            return decode_rows(decoder, undecided, key, value, headers, topic, timestamp)

        return outboxkit_registry_decode


def decode_rows(  # noqa: PLR0917 (the UDF's columns, in order)
    decoder: PythonDecoder,
    undecided: pa.Array,
    key: pa.Array,
    value: pa.Array,
    headers: pa.Array,
    topic: pa.Array,
    timestamp: pa.Array | None = None,
) -> pa.Array:
    """One struct per row: the registry's verdict where ``undecided`` is true, else null.
    ``timestamp`` (the Kafka record's) is the time of a foreign event without ``time``, as
    the inbox's ``decode_record`` takes it."""
    arrow_type = decoder.arrow_type
    flags = undecided.to_pylist()
    wanted = [i for i, flag in enumerate(flags) if flag]
    if not wanted:
        return pa.nulls(len(flags), type=arrow_type)
    rows: list[dict[str, Any] | None] = [None] * len(flags)
    for index in wanted:
        rows[index] = _decode_one(
            decoder,
            key=key[index].as_py(),
            value=value[index].as_py(),
            headers=headers[index].as_py(),
            topic=topic[index].as_py(),
            record_time=None if timestamp is None else _utc(timestamp[index].as_py()),
        )
    return _to_arrow(rows, arrow_type)


def _decode_one(
    decoder: PythonDecoder,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: list[dict[str, Any]] | None,
    topic: str,
    record_time: datetime | None,
) -> dict[str, Any]:
    pairs = [(h["key"], h["value"]) for h in headers or ()]
    try:
        event = decoder.registry.decode(
            topic=topic, key=key, value=value, headers=pairs, record_time=record_time
        )
    except EventDecodeError as exc:
        return _error(str(exc.reason), str(exc), type(exc).__qualname__)
    column = decoder._columns[(event.event_type, event.event_version)]
    return {
        "event_id": str(event.id),
        "event_type": event.event_type,
        "event_version": event.event_version,
        "event_key": event.key,
        "occurred_at": event.occurred_at,
        column: _plain(event.model_dump(by_alias=True)),
    }


def _utc(moment: datetime | None) -> datetime | None:
    """A timestamp from Arrow: aware as Spark sends it, or naive in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _error(reason: str, message: str, error_type: str) -> dict[str, Any]:
    return {
        "error_reason": reason,
        "error_message": message[:MESSAGE_LIMIT],
        "error_type": error_type,
    }


def _to_arrow(rows: list[dict[str, Any] | None], arrow_type: pa.StructType) -> pa.Array:
    """The rows as Arrow; an event that does not fit its column is quarantined instead."""
    try:
        return pa.array(rows, type=arrow_type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        pass
    for index, row in enumerate(rows):
        if row is None or row.get("error_reason"):
            continue
        try:
            pa.array([row], type=arrow_type)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            column = next(k for k in row if k not in ENVELOPE_COLUMNS)
            rows[index] = _error(
                UNREPRESENTABLE,
                f"the event does not fit Spark column {column!r}: {exc}",
                type(exc).__qualname__,
            )
    return pa.array(rows, type=arrow_type)


def _plain(value: Any) -> Any:
    """A model dump as values Arrow converts: UUIDs as text, enums as values, sets as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return _plain(value.value)
    if isinstance(value, UUID):
        return str(value)
    return value
