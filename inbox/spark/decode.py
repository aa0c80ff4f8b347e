"""Kafka records → typed events or quarantine rows, validated by the shared registry.

:class:`RecordDecoder` runs inside ``DataFrame.mapInArrow`` on the executors. Each record goes
through :meth:`outboxkit.schemas.EventRegistry.decode` — the very code the Python inbox runs —
so a record is valid here exactly when it is valid there (Pydantic constraints, strict types,
header rules). A decoded event becomes a struct in the column of its model (see
:func:`event_column`; its Spark type is :func:`~outboxkit.inbox.spark.schema.spark_schema`); a
record that does not decode keeps its raw key, value and headers and gets the error, like a
dead-lettered record of the inbox.

The decoding itself needs no SparkSession: it is unit-testable on Arrow batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import Enum
from typing import Any
from uuid import UUID

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from outboxkit.inbox.spark.exceptions import SchemaMappingError
from outboxkit.inbox.spark.schema import spark_schema
from outboxkit.schemas import Event, EventDecodeError, EventRegistry

#: Error reason of an event that decodes but does not fit its Spark column (e.g. a Decimal with
#: more digits than the column's precision). The other reasons are ``DecodeErrorReason`` values.
UNREPRESENTABLE = "unrepresentable"

#: Columns every decoded row has (``occurred_at`` is the event time; null when quarantined).
ENVELOPE_COLUMNS = ("event_id", "event_type", "event_version", "event_key", "occurred_at")
#: The Kafka source's columns, kept for quarantine.
RAW_COLUMNS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")
#: The error, named like the inbox's dead-letter headers (``outboxkit-error-reason`` …).
ERROR_COLUMNS = ("error_reason", "error_message", "error_type")


def event_column(model: type[Event]) -> str:
    """Column of the decoded DataFrame that holds ``model``'s events, e.g.
    ``shop_order_placed_v1`` for type ``shop.order_placed`` version 1."""
    return re.sub(r"\W", "_", f"{model.event_type}_v{model.event_version}", flags=re.ASCII)


def decoded_schema(registry: EventRegistry) -> StructType:
    """The schema of :class:`RecordDecoder`'s output for ``registry``."""
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
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("event_id", StringType()),
            StructField("event_type", StringType()),
            StructField("event_version", IntegerType()),
            StructField("event_key", StringType()),
            StructField("occurred_at", TimestampType()),
            *(StructField(name, spark_schema(model)) for name, model in columns.items()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", ArrayType(header)),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("error_reason", StringType()),
            StructField("error_message", StringType()),
            StructField("error_type", StringType()),
        ]
    )


class RecordDecoder:
    """``mapInArrow`` function: Kafka source batches → :func:`decoded_schema` batches.

    Picklable (it holds the registry, whose models are pickled by reference, and the Arrow
    schema's Spark description). Raw key, value and headers are kept only on quarantined rows.
    """

    def __init__(self, registry: EventRegistry) -> None:
        self.registry = registry
        self.spark_schema = decoded_schema(registry)
        self._columns = {(m.event_type, m.event_version): event_column(m) for m in registry}
        self._arrow: pa.Schema | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrow": None}

    @property
    def arrow_schema(self) -> pa.Schema:
        if self._arrow is None:
            self._arrow = to_arrow_schema(self.spark_schema, timezone="UTC")
        return self._arrow

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.decode_batch(batch)

    def decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows: list[dict[str, Any]] = batch.to_pylist()
        out: dict[str, list[Any]] = {field.name: [] for field in self.arrow_schema}
        events: dict[str, list[Any]] = {name: [] for name in self._columns.values()}
        for row in rows:
            event, error = self._decode(row)
            column = self._columns[(event.event_type, event.event_version)] if event else None
            for name, values in events.items():
                dump = event.model_dump(by_alias=True) if event and name == column else None
                values.append(_plain(dump))
            _append_row(out, row, event, error)
        for name, values in events.items():
            out[name] = self._to_arrow_or_quarantine(name, values, out, rows)
        return pa.RecordBatch.from_pydict(out, schema=self.arrow_schema)

    def _decode(self, row: dict[str, Any]) -> tuple[Event | None, BaseException | None]:
        headers = [(h["key"], h["value"]) for h in row.get("headers") or ()]
        try:
            event = self.registry.decode(
                topic=row["topic"], key=row["key"], value=row["value"], headers=headers
            )
        except EventDecodeError as exc:
            return None, exc
        return event, None

    def _to_arrow_or_quarantine(
        self, name: str, values: list[Any], out: dict[str, list[Any]], rows: list[dict[str, Any]]
    ) -> pa.Array:
        """The column as Arrow; events that do not fit their column are quarantined instead."""
        arrow_type = self.arrow_schema.field(name).type
        try:
            return pa.array(values, type=arrow_type)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass
        for index, value in enumerate(values):
            if value is None:
                continue
            try:
                pa.array([value], type=arrow_type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                values[index] = None
                _quarantine_decoded(out, rows[index], index, name, exc)
        return pa.array(values, type=arrow_type)


def _append_row(
    out: dict[str, list[Any]],
    row: dict[str, Any],
    event: Event | None,
    error: BaseException | None,
) -> None:
    out["event_id"].append(str(event.id) if event else None)
    out["event_type"].append(event.event_type if event else None)
    out["event_version"].append(event.event_version if event else None)
    out["event_key"].append(event.key if event else None)
    out["occurred_at"].append(event.occurred_at if event else None)
    out["key"].append(row["key"])
    out["value"].append(None if event else row["value"])
    out["headers"].append(None if event else row.get("headers"))
    for name in ("topic", "partition", "offset", "timestamp"):
        out[name].append(row[name])
    reason = getattr(error, "reason", None)
    out["error_reason"].append(str(reason) if error else None)
    out["error_message"].append(str(error)[:4000] if error else None)
    out["error_type"].append(type(error).__qualname__ if error else None)


def _quarantine_decoded(
    out: dict[str, list[Any]], row: dict[str, Any], index: int, column: str, exc: BaseException
) -> None:
    """Turn a decoded row back into a quarantine row."""
    for name in ENVELOPE_COLUMNS:
        out[name][index] = None
    out["value"][index] = row["value"]
    out["headers"][index] = row.get("headers")
    out["error_reason"][index] = UNREPRESENTABLE
    out["error_message"][index] = f"the event does not fit Spark column {column!r}: {exc}"[:4000]
    out["error_type"][index] = type(exc).__qualname__


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
