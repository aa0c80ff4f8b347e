"""Kafka records → typed events or quarantine rows, decided once, on the JVM where it can be.

:func:`decode` is one projection over the Kafka source's rows:

1. **Envelope** (:mod:`~outboxkit.pipeline.envelope`): the CloudEvents headers, recognised
   with Spark SQL.
2. **Routing**: ``(ce_type, ce_schemaversion)`` → the model's column. With a well-formed
   envelope, an unregistered type (``unknown_type``), a registered type without that version
   (``unsupported_version``), a missing, empty or non-UTF-8 key (``invalid_key``) and a
   missing or non-UTF-8 value (``invalid_value``) are decided here — with exactly the Python
   decoder's reasons, since it checks them in the same order once the envelope is read.
3. **Payload** (:mod:`~outboxkit.pipeline.payload`): ``from_json`` with the schema derived
   from the model; accepted when the text is canonical and the values pass the constraints.
4. **Everything else** — a malformed envelope, a payload that is invalid or not canonical
   (one with fields its model does not declare, which the registry ignores), a version read
   through upcasters, a model the JVM path does not support — goes through the registry itself
   in one Arrow
   pass (:mod:`~outboxkit.pipeline.fallback`), so every record gets the Python decoder's
   verdict: a valid event becomes a struct in its model's column, anything else a quarantine
   row with ``error_reason`` (the ``DecodeErrorReason`` values, or ``unrepresentable``).

The output has the envelope columns (``event_id event_type event_version event_key
occurred_at``), one struct column per model (:func:`~outboxkit.pipeline.fallback.event_column`),
the Kafka source's columns (``value`` and ``headers`` only on quarantine rows), the error
columns (``error_reason error_message error_type``) and ``decoded_by`` (``jvm`` or
``python``: which pass decided the record).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import arrow_udf

from outboxkit.pipeline.envelope import read_envelope
from outboxkit.pipeline.fallback import (
    ENVELOPE_COLUMNS,
    RAW_COLUMNS,
    PythonDecoder,
    model_columns,
)
from outboxkit.pipeline.payload import jvm_decodable, parse_schema, payload_checks, typed_payload
from outboxkit.schemas import Event, EventRegistry
from outboxkit.schemas.exceptions import DecodeErrorReason

#: The Python pass's own name in the plan (``explain()`` shows it).
FALLBACK_NAME = "outboxkit_registry_decode"

_ERROR_TYPE = "EventDecodeError"


def decode(records: DataFrame, registry: EventRegistry) -> DataFrame:
    """Decode the Kafka source's rows (``key value headers topic partition offset timestamp``)
    with ``registry``; works on streaming and batch DataFrames."""
    models = model_columns(registry)
    envelope = read_envelope(F.col("headers"))
    routed = records.select(
        *RAW_COLUMNS,
        envelope.ok.alias("_ok"),
        envelope.event_id.alias("_id"),
        envelope.event_type.alias("_type"),
        envelope.version.alias("_version"),
        envelope.time.alias("_time"),
    )
    route = F.lit(None).cast("string")
    for name, model in reversed(models.items()):
        if model.event_version in registry.upcast_versions(model.event_type):
            continue  # its records are upcast (in the Python pass), not read as this model
        match = (F.col("_type") == model.event_type) & (F.col("_version") == model.event_version)
        route = F.when(F.col("_ok") & match, F.lit(name)).otherwise(route)
    routed = routed.withColumn("_model", route)
    reason, message = _rejections(registry)
    routed = routed.withColumn("_reason", reason).withColumn("_message", message)

    value_text = F.col("value").cast("string")
    parsed = [
        F.when(
            (F.col("_model") == name) & F.col("_reason").isNull(),
            F.from_json(value_text, parse_schema(model), {"mode": "PERMISSIVE"}),
        ).alias(f"_p_{name}")
        for name, model in models.items()
        if jvm_decodable(model)
    ]
    parsed_df = routed.select("*", *parsed)
    valid = {}
    for name, model in models.items():
        if not jvm_decodable(model):
            continue
        column = F.col(f"_p_{name}")
        canonical = F.to_json(column, {"ignoreNullFields": "false"}) == value_text
        valid[name] = F.coalesce(
            column.isNotNull() & canonical & payload_checks(model, column), F.lit(False)
        )
    checked = parsed_df.select(
        "*",
        *(check.alias(f"_v_{name}") for name, check in valid.items()),
    )
    # The last reason, a value that is not UTF-8, only where no payload was accepted: to_json
    # writes valid UTF-8, so a value equal to it is valid (and need not be scanned).
    accepted = _any(f"_v_{n}" for n in valid)
    not_utf8 = F.col("_not_utf8")
    checked = (
        checked.withColumn(
            "_not_utf8",
            F.col("_ok") & F.col("_reason").isNull() & ~accepted & ~F.is_valid_utf8(F.col("value")),
        )
        .withColumn(
            "_reason",
            F.when(not_utf8, F.lit(str(DecodeErrorReason.INVALID_VALUE))).otherwise(
                F.col("_reason")
            ),
        )
        .withColumn(
            "_message",
            F.when(not_utf8, F.lit("the record value is not valid UTF-8")).otherwise(
                F.col("_message")
            ),
        )
        .withColumn("_undecided", ~F.col("_ok") | (F.col("_reason").isNull() & ~accepted))
    )

    decoder = PythonDecoder(registry)
    make_udf: Any = arrow_udf  # typed by the function's hints (pyspark's stubs cannot say so)
    python = make_udf(decoder.function(), decoder.schema)
    undecided = F.col("_undecided")
    with_python = checked.withColumn(
        "_py",
        python(
            undecided,
            *(
                F.when(undecided, F.col(c))
                for c in ("key", "value", "headers", "topic", "timestamp")
            ),
        ),
    )
    return with_python.select(*_output(models, valid.keys()))


def _any(names: Iterable[str]) -> Column:
    result = F.lit(False)
    for name in names:
        result = result | F.col(name)
    return result


def _rejections(registry: EventRegistry) -> tuple[Column, Column]:
    """The reasons decided on the JVM (a well-formed envelope first), and their messages."""
    types = sorted({model.event_type for model in registry})
    quoted = F.concat(F.lit("event type '"), F.col("_type"), F.lit("'"))
    known = F.lit("")
    upcast = F.lit(False)
    for event_type in types:
        versions = ", ".join(map(str, registry.readable_versions(event_type)))
        known = F.when(F.col("_type") == event_type, F.lit(versions)).otherwise(known)
        if upcasts := registry.upcast_versions(event_type):
            upcast = upcast | ((F.col("_type") == event_type) & F.col("_version").isin(*upcasts))
    key, value = F.col("key"), F.col("value")
    cases: list[tuple[Column, str, Column]] = [
        (
            ~F.col("_type").isin(*types) if types else F.lit(True),
            DecodeErrorReason.UNKNOWN_TYPE,
            F.concat(quoted, F.lit(" is not registered")),
        ),
        (
            F.col("_model").isNull() & ~upcast,  # an upcast version goes to the Python pass
            DecodeErrorReason.UNSUPPORTED_VERSION,
            F.concat(
                quoted,
                F.lit(" has no version "),
                F.col("_version").cast("string"),
                F.lit("; known versions: "),
                known,
            ),
        ),
        (key.isNull(), DecodeErrorReason.INVALID_KEY, F.lit("the record has no key")),
        (F.length(key) == 0, DecodeErrorReason.INVALID_KEY, F.lit("the record key is empty")),
        (
            ~F.is_valid_utf8(key),
            DecodeErrorReason.INVALID_KEY,
            F.lit("the record key is not valid UTF-8"),
        ),
        (
            value.isNull(),
            DecodeErrorReason.INVALID_VALUE,
            F.lit("the record has no value (a tombstone?)"),
        ),
    ]  # then a value that is not valid UTF-8: see decode
    reason = F.lit(None).cast("string")
    message = F.lit(None).cast("string")
    for condition, why, text in reversed(cases):
        reason = F.when(condition, F.lit(str(why))).otherwise(reason)
        message = F.when(condition, text).otherwise(message)
    ok = F.col("_ok")
    return F.when(ok, reason), F.when(ok, message)


def _output(models: Mapping[str, type[Event]], jvm_models: Collection[str]) -> list[Column]:
    undecided = F.col("_undecided")
    py = F.col("_py")
    valid = ~undecided & F.col("_reason").isNull()
    key_text = F.col("key").cast("string")
    jvm_envelope = {
        "event_id": F.col("_id"),
        "event_type": F.col("_type"),
        "event_version": F.col("_version").cast("int"),
        "event_key": key_text,
        "occurred_at": F.col("_time"),
    }
    columns = [
        F.when(undecided, py[name]).when(valid, jvm_envelope[name]).alias(name)
        for name in ENVELOPE_COLUMNS
    ]
    envelope = read_envelope(F.col("headers"))
    fields = [
        F.col("_id").alias("id"),
        key_text.alias("key"),
        F.col("topic").alias("topic"),
        F.col("_time").alias("occurred_at"),
        envelope.user_headers.alias("headers"),
    ]
    for name, model in models.items():
        if name in jvm_models:
            payload = typed_payload(model, F.col(f"_p_{name}"))
            struct = F.struct(*fields, *payload)
            columns.append(
                F.when(undecided, py[name]).when(F.col(f"_v_{name}"), struct).alias(name)
            )
        else:
            columns.append(F.when(undecided, py[name]).alias(name))
    reason = F.when(undecided, py["error_reason"]).otherwise(F.col("_reason"))
    quarantined = reason.isNotNull()
    columns += [
        F.col("key"),
        F.when(quarantined, F.col("value")).alias("value"),
        F.when(quarantined, F.col("headers")).alias("headers"),
        *(F.col(c) for c in RAW_COLUMNS[3:]),
        reason.alias("error_reason"),
        F.when(undecided, py["error_message"]).otherwise(F.col("_message")).alias("error_message"),
        F.when(undecided, py["error_type"])
        .when(F.col("_reason").isNotNull(), F.lit(_ERROR_TYPE))
        .alias("error_type"),
        F.when(undecided, F.lit("python")).otherwise(F.lit("jvm")).alias("decoded_by"),
    ]
    return columns
