"""The pipeline: Kafka → decode → quarantine | dedupe → sinks, as Structured Streaming queries.

Building blocks (each a plain DataFrame function, usable in your own jobs):

- :func:`read_kafka` — Spark's Kafka source, ``read_committed``, headers included;
- :func:`decode` — every record through the shared registry (:class:`RecordDecoder`);
- :func:`quarantined` / :func:`valid_events` — the two halves of a decoded stream;
- :func:`deduplicated` — watermark on the event time, then ``dropDuplicatesWithinWatermark``
  on the event id.

:func:`start_pipeline` starts the example's three queries (quarantine → Parquet, order totals
→ Parquet, order totals → PostgreSQL), each with its own checkpoint under the checkpoint root;
:func:`run_pipeline` also waits for them and reports what they did.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from outboxkit.demo.events import registry as shop_registry
from outboxkit.pipeline import totals
from outboxkit.pipeline.decode import RecordDecoder
from outboxkit.pipeline.exceptions import PipelineError
from outboxkit.pipeline.jars import connector_jars, fetch_connector
from outboxkit.pipeline.settings import PipelineSettings, spark_duration
from outboxkit.pipeline.sinks import PostgresBatchSink
from outboxkit.schemas import EventRegistry

logger = structlog.get_logger("outboxkit.pipeline")

#: Local runs use few shuffle (= state store) partitions: 200 would mean 200 tiny state stores.
LOCAL_SHUFFLE_PARTITIONS = 4


def under_spark_submit() -> bool:
    """Whether this Python process was started by ``spark-submit`` (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(settings: PipelineSettings) -> SparkSession:
    """The session: local (master and connector jars from the settings) unless under
    ``spark-submit``, which brings its own master and ``--packages``."""
    builder = SparkSession.builder.appName(f"outboxkit-{settings.pipeline_name}")
    partitions = settings.spark_shuffle_partitions
    if not under_spark_submit():
        jars_dir = settings.spark_jars or str(
            fetch_connector(version=settings.spark_connector_version)
        )
        jars = ",".join(str(jar) for jar in connector_jars(Path(jars_dir)))
        builder = (
            builder.master(settings.spark_master)
            .config("spark.jars", jars)
            .config("spark.ui.showConsoleProgress", "false")
        )
        partitions = partitions or LOCAL_SHUFFLE_PARTITIONS
        use_this_python_for_workers()
    spark = builder.getOrCreate()
    configure_session(spark, shuffle_partitions=partitions)
    return spark


def use_this_python_for_workers() -> None:
    """Local Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise.
    PySpark reads only that variable (``spark.pyspark.python`` is spark-submit's), and its
    default, ``python3`` from ``PATH``, lacks outboxkit outside an activated virtualenv: the
    decoder would fail on the first record."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def configure_session(spark: SparkSession, *, shuffle_partitions: int | None = None) -> None:
    """Runtime settings the pipeline relies on: event times and windows in UTC."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))


def read_kafka(spark: SparkSession, settings: PipelineSettings) -> DataFrame:
    """The outbox topics as a stream of raw records (only committed transactions)."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", ",".join(settings.kafka_bootstrap_servers))
        .option("subscribe", ",".join(settings.topics))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("startingOffsets", settings.pipeline_starting_offsets)
    )
    if settings.pipeline_max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.pipeline_max_offsets_per_trigger)
    return reader.load()


def decode(records: DataFrame, registry: EventRegistry) -> DataFrame:
    """Decode Kafka records with ``registry`` (see :mod:`outboxkit.pipeline.decode`)."""
    decoder = RecordDecoder(registry)
    return records.mapInArrow(decoder, decoder.spark_schema)


def valid_events(decoded: DataFrame) -> DataFrame:
    """The rows that decoded: envelope, one struct column per model, and the source position."""
    keep = [name for name in decoded.columns if name not in _QUARANTINE_ONLY]
    return decoded.where(F.col("error_reason").isNull()).select(*keep)


_QUARANTINE_ONLY = frozenset(
    {"key", "value", "headers", "timestamp", "error_reason", "error_message", "error_type"}
)


def quarantined(decoded: DataFrame, pipeline: str) -> DataFrame:
    """The rows that did not decode: raw bytes and headers, where they came from, and why."""
    return decoded.where(F.col("error_reason").isNotNull()).select(
        "key",
        "value",
        "headers",
        F.col("topic").alias("source_topic"),
        F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        "error_reason",
        "error_message",
        "error_type",
        F.lit(pipeline).alias("pipeline"),
        F.current_timestamp().alias("quarantined_at"),
    )


def deduplicated(events: DataFrame, settings: PipelineSettings) -> DataFrame:
    """Events with a watermark on ``occurred_at``, each event id once within the watermark."""
    return events.withWatermark(
        "occurred_at", spark_duration(settings.pipeline_watermark)
    ).dropDuplicatesWithinWatermark(["event_id"])


def query_names(settings: PipelineSettings) -> dict[str, str]:
    """The example's query names (also their checkpoint subdirectories)."""
    name = settings.pipeline_name
    return {
        "quarantine": f"{name}.quarantine",
        "lake": f"{name}.order_totals.parquet",
        "serving": f"{name}.order_totals.postgresql",
    }


def _with_trigger(
    writer: DataStreamWriter, settings: PipelineSettings, name: str
) -> DataStreamWriter:
    writer = writer.queryName(name).option(
        "checkpointLocation", f"{settings.checkpoint.rstrip('/')}/{name}"
    )
    trigger = settings.pipeline_trigger
    if isinstance(trigger, str):
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=spark_duration(trigger))


def prepare_serving_table(settings: PipelineSettings) -> None:
    """Create the serving table if missing; check that migration 0004 is applied."""
    if settings.database_url is None:
        return
    try:
        with psycopg.connect(settings.database_url, connect_timeout=10) as conn:
            conn.execute(totals.create_table_sql(settings.pipeline_table))
            found = conn.execute(
                "SELECT to_regclass('outboxkit.pipeline_batches') IS NOT NULL"
            ).fetchone()
    except psycopg.Error as exc:
        raise PipelineError(f"preparing the serving table failed: {exc}") from exc
    if not (found and found[0]):
        raise PipelineError(
            "outboxkit.pipeline_batches is missing: run `outboxkit migrate` on this database"
        )


def start_pipeline(
    spark: SparkSession, settings: PipelineSettings, registry: EventRegistry | None = None
) -> list[StreamingQuery]:
    """Start the example's queries; returns them (already running)."""
    registry = registry or shop_registry
    prepare_serving_table(settings)
    names = query_names(settings)
    decoded = decode(read_kafka(spark, settings), registry)
    events = deduplicated(valid_events(decoded), settings)
    queries = []
    try:
        quarantine = _with_trigger(
            quarantined(decoded, settings.pipeline_name).writeStream.format("parquet"),
            settings,
            names["quarantine"],
        ).option("path", settings.output("quarantine"))
        queries.append(quarantine.start())
        lake = _with_trigger(
            totals.order_totals(events, settings.pipeline_window)
            .writeStream.format("parquet")
            .outputMode("append"),
            settings,
            names["lake"],
        ).option("path", settings.output("order_totals"))
        queries.append(lake.start())
        if settings.database_url is not None:
            sink = PostgresBatchSink(
                settings.database_url,
                query_name=names["serving"],
                statement=totals.add_totals_sql(settings.pipeline_table),
                prepare=lambda batch: totals.order_totals(batch, settings.pipeline_window),
                columns=totals.COLUMNS,
            )
            serving = _with_trigger(
                events.writeStream.outputMode("append").foreachBatch(sink),
                settings,
                names["serving"],
            )
            queries.append(serving.start())
    except BaseException:
        for query in queries:
            query.stop()
        raise
    return queries


@dataclass(frozen=True)
class QueryReport:
    """What one query did in this run (from its retained progress updates)."""

    name: str
    batches: int
    input_rows: int
    late_rows: int
    """Rows dropped because their event time was behind the watermark (see docs/spark.md)."""


def report(query: StreamingQuery) -> QueryReport:
    progress = [p for p in query.recentProgress if p.numInputRows is not None]
    return QueryReport(
        name=query.name or str(query.id),
        batches=len(progress),
        input_rows=sum(p.numInputRows for p in progress),
        late_rows=sum(
            op.numRowsDroppedByWatermark or 0 for p in progress for op in p.stateOperators
        ),
    )


class ProgressLog(StreamingQueryListener):
    """Logs every micro-batch of every query, and warns about rows behind the watermark."""

    def onQueryStarted(self, event: Any) -> None:
        logger.info("query started", query=event.name, id=str(event.id))

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        late = sum(op.numRowsDroppedByWatermark or 0 for op in progress.stateOperators)
        log = logger.warning if late else logger.info
        log(
            "batch done",
            query=progress.name,
            batch_id=progress.batchId,
            input_rows=progress.numInputRows,
            late_rows_dropped=late,
        )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            logger.error("query failed", id=str(event.id), error=event.exception)


def await_queries(
    queries: Iterable[StreamingQuery], *, stop: threading.Event | None = None
) -> list[QueryReport]:
    """Wait until every query ends (available-now) or ``stop`` is set (then stop them all).

    A failed query stops the others and raises :class:`PipelineError`."""
    queries = list(queries)
    stop = stop or threading.Event()
    try:
        while any(q.isActive for q in queries):
            failed = [q for q in queries if not q.isActive and q.exception() is not None]
            if failed or stop.wait(0.5):
                break
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
    for query in queries:
        error = query.exception()
        if error is not None:
            raise PipelineError(f"query {query.name} failed: {error}")
    reports = [report(q) for q in queries]
    for r in reports:
        logger.info("query finished", **r.__dict__)
    return reports


def run_pipeline(
    settings: PipelineSettings,
    registry: EventRegistry | None = None,
    *,
    spark: SparkSession | None = None,
    stop: threading.Event | None = None,
) -> list[QueryReport]:
    """Run the example pipeline until the backlog is done (available-now) or ``stop`` is set."""
    if spark is None:
        spark = build_session(settings)
    else:
        configure_session(spark, shuffle_partitions=settings.spark_shuffle_partitions)
    listener = ProgressLog()
    spark.streams.addListener(listener)
    try:
        return await_queries(start_pipeline(spark, settings, registry), stop=stop)
    finally:
        spark.streams.removeListener(listener)
