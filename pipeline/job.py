"""The pipeline: one streaming query, one pass per micro-batch.

::

    Kafka ─► decode (JVM; registry for the rest) ─► watermark ─► dropDuplicatesWithinWatermark
          ─► foreachBatch: persist ─┬─ quarantine rows ─► quarantine sink (Delta)
                                    └─ valid events ─► each Output's transform ─► its sinks
                                       unpersist

Everything is read from Kafka and decoded once per micro-batch; the batch is persisted while
its sinks read it. Each sink makes a re-run of the same batch id a no-op (:mod:`.sinks`), so
after a crash Spark's re-run of the last batch changes nothing that was already written.

Building blocks, usable in your own jobs: :func:`read_kafka`, :func:`decode`,
:func:`deduplicated`, :func:`valid_events`, :func:`quarantined`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import structlog
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from outboxkit.pipeline.decoder import decode
from outboxkit.pipeline.exceptions import PipelineError
from outboxkit.pipeline.fallback import model_columns
from outboxkit.pipeline.kafka_options import redact_in_plans, spark_kafka_options
from outboxkit.pipeline.payload import why_not_jvm_decodable
from outboxkit.pipeline.session import build_session, configure_session, node_local_paths
from outboxkit.pipeline.settings import PipelineSettings, spark_duration
from outboxkit.pipeline.sinks import BatchInfo, DeltaSink, Sink
from outboxkit.schemas import EventRegistry

logger = structlog.get_logger("outboxkit.pipeline")

#: The local property Spark sets on the thread that runs a streaming query's micro-batches.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"

#: What a call into Spark's JVM raises once the JVM is gone: a Py4JError on a connection py4j
#: already had, ConnectionRefusedError (not a Py4JError) when it opens a new one.
_JVM_GONE = (Py4JError, ConnectionError)


@dataclass(frozen=True)
class Output:
    """One result of the pipeline: ``transform`` turns a micro-batch's valid, deduplicated
    events into rows (e.g. aggregates), which every sink in ``sinks`` receives."""

    name: str
    transform: Callable[[DataFrame], DataFrame]
    sinks: Sequence[Sink]


@dataclass(frozen=True)
class Pipeline:
    """Your events (``registry``) and what to make of them (``outputs``).

    Records that do not decode go to ``quarantine`` (by default a Delta table
    ``<output>/quarantine``)."""

    registry: EventRegistry
    outputs: Sequence[Output]
    quarantine: Sink | None = field(default_factory=lambda: DeltaSink("quarantine"))

    @property
    def topics(self) -> list[str]:
        """The registered models' default topics (``OUTBOXKIT_TOPICS`` overrides them)."""
        return sorted({m.event_topic for m in self.registry if m.event_topic})


#: How long the driver's offset lookups wait. Kafka's AdminClient (kafka-clients 3.9, the
#: connector's) routes a partition to its cached leader; when that broker is gone the lookup
#: waits out ``default.api.timeout.ms`` (60 s) before failing (KAFKA-20673), and Spark retries
#: with a fresh client: every broker loss froze the query for a minute (tests/integration/
#: test_spark_cluster.py). 15 s per attempt (Kafka wants a request timeout no longer than
#: that), and as many attempts as Spark's default patience (3 retries of 60 s) allows.
ADMIN_PATIENCE = {
    "kafka.default.api.timeout.ms": "15000",
    "kafka.request.timeout.ms": "10000",
    "fetchOffset.numRetries": "12",
}


def read_kafka(spark: SparkSession, settings: PipelineSettings, topics: Sequence[str]) -> DataFrame:
    """The topics as a stream of raw records (only committed transactions), headers included."""
    redact_in_plans(spark)
    reader = (
        spark.readStream.format("kafka")
        .options(**spark_kafka_options(settings))
        .option("subscribe", ",".join(topics))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("startingOffsets", settings.pipeline_starting_offsets)
        .options(**ADMIN_PATIENCE)
    )
    if settings.pipeline_max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.pipeline_max_offsets_per_trigger)
    return reader.load()


def deduplicated(decoded: DataFrame, settings: PipelineSettings) -> DataFrame:
    """Each event id once within the watermark on ``occurred_at``.

    Quarantine rows have no event time and no event id: they are keyed by their Kafka position,
    are never late, and their state is dropped at the next watermark."""
    key = F.coalesce(
        F.col("event_id"),
        F.concat_ws(":", F.lit("kafka"), "topic", "partition", "offset"),
    )
    return (
        decoded.withColumn("dedupe_key", key)
        .withWatermark("occurred_at", spark_duration(settings.pipeline_watermark))
        .dropDuplicatesWithinWatermark(["dedupe_key"])
        .drop("dedupe_key")
    )


_QUARANTINE_ONLY = frozenset(
    {"key", "value", "headers", "timestamp", "error_reason", "error_message", "error_type"}
)


def valid_events(decoded: DataFrame) -> DataFrame:
    """The rows that decoded: envelope, one struct column per model, and the source position."""
    keep = [c for c in decoded.columns if c not in _QUARANTINE_ONLY]
    return decoded.where(F.col("error_reason").isNull()).select(*keep)


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


class BatchWriter:
    """The ``foreachBatch`` function: one micro-batch to every sink."""

    def __init__(self, pipeline: Pipeline, settings: PipelineSettings) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.seconds: dict[str, float] = {}
        """Wall time spent in each step of every micro-batch so far (``quarantine``, then each
        sink by name): the ``addBatch`` of the progress reports, broken down."""

    def _timed(self, step: str, started: float, batch_id: int) -> None:
        seconds = time.perf_counter() - started
        self.seconds[step] = self.seconds.get(step, 0.0) + seconds
        logger.debug("step done", step=step, batch_id=batch_id, seconds=round(seconds, 3))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        query_id = spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        if not query_id:
            raise PipelineError("BatchWriter must run as a foreachBatch function")
        info = BatchInfo(
            query_id=query_id,
            query_name=self.settings.pipeline_name,
            batch_id=batch_id,
            settings_output=self.settings.pipeline_output,
            database_url=self.settings.database_url,
        )
        decoded = batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            quarantine = self.pipeline.quarantine
            if quarantine is not None:
                started = time.perf_counter()
                quarantine.write(quarantined(decoded, self.settings.pipeline_name), info)
                self._timed("quarantine", started, batch_id)
            events = valid_events(decoded)
            for output in self.pipeline.outputs:
                rows = output.transform(events)
                several = len(output.sinks) > 1
                if several:
                    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
                try:
                    for sink in output.sinks:
                        started = time.perf_counter()
                        sink.write(rows, info)
                        self._timed(sink.name, started, batch_id)
                finally:
                    if several:
                        rows.unpersist()
        finally:
            decoded.unpersist()


def start(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: PipelineSettings,
    *,
    writer: BatchWriter | None = None,
) -> StreamingQuery:
    """Prepare the sinks and start the pipeline's query (already running when returned);
    ``writer``, the ``foreachBatch`` function, is made here unless given."""
    for model in pipeline.registry:
        why = why_not_jvm_decodable(model)
        if why:
            logger.warning("model decoded in Python", model=model.event_type, reason=why)
    model_columns(pipeline.registry)  # fails early on clashing column names
    sinks = [s for o in pipeline.outputs for s in o.sinks]
    if pipeline.quarantine is not None:
        sinks.append(pipeline.quarantine)
    for sink in sinks:
        sink.prepare(spark, settings.pipeline_output, settings.database_url)
    topics = settings.topics or pipeline.topics
    if not topics:
        raise PipelineError("no topics: set OUTBOXKIT_TOPICS or give the models a topic")
    master = spark.sparkContext.master or ""
    for path in node_local_paths(master, settings):
        logger.warning(
            "a local path on a cluster: every machine must mount the same directory there, "
            "or give a URI all of them reach (hdfs://, s3a://, abfss://…)",
            path=path,
            master=master,
        )
    stream = deduplicated(decode(read_kafka(spark, settings, topics), pipeline.registry), settings)
    stream_writer = (
        stream.writeStream.queryName(settings.pipeline_name)
        .option("checkpointLocation", f"{settings.checkpoint.rstrip('/')}/{settings.pipeline_name}")
        .outputMode("append")
        .foreachBatch(writer or BatchWriter(pipeline, settings))
    )
    trigger = settings.pipeline_trigger
    if isinstance(trigger, str):
        stream_writer = stream_writer.trigger(availableNow=True)
    else:
        stream_writer = stream_writer.trigger(processingTime=spark_duration(trigger))
    return stream_writer.start()


@dataclass(frozen=True)
class QueryReport:
    """What the query did in this run (from its retained progress updates)."""

    name: str
    batches: int
    input_rows: int
    late_rows: int
    """Rows dropped because their event time was behind the watermark (see docs/spark.md)."""
    duration_ms: dict[str, int] = field(default_factory=dict)
    """Spark's ``durationMs`` of the batches, summed: ``addBatch`` (reading, decoding,
    deduplicating and every sink), ``latestOffset``, ``queryPlanning``, ``walCommit``,
    ``commitOffsets``, ``triggerExecution`` (the whole micro-batch)…"""
    step_seconds: dict[str, float] = field(default_factory=dict)
    """``addBatch`` broken down: seconds in the quarantine sink and in each sink, summed over
    the batches. The first step also reads, decodes and deduplicates the batch."""


def report(query: StreamingQuery, writer: BatchWriter | None = None) -> QueryReport:
    progress = [p for p in query.recentProgress if p.numInputRows is not None]
    durations: dict[str, int] = {}
    for p in progress:
        for key, value in (p.durationMs or {}).items():
            durations[key] = durations.get(key, 0) + int(value)
    return QueryReport(
        name=query.name or str(query.id),
        batches=len(progress),
        input_rows=sum(p.numInputRows for p in progress),
        late_rows=sum(
            op.numRowsDroppedByWatermark or 0 for p in progress for op in p.stateOperators
        ),
        duration_ms=durations,
        step_seconds=dict(writer.seconds) if writer else {},
    )


class ProgressLog(StreamingQueryListener):
    """Logs every micro-batch, and warns about rows behind the watermark; counts what it saw
    (the report of a query whose JVM went away first, :func:`await_query`)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.input_rows = 0
        self.late_rows = 0

    def onQueryStarted(self, event: Any) -> None:
        logger.info("query started", query=event.name, id=str(event.id))

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        late = sum(op.numRowsDroppedByWatermark or 0 for op in progress.stateOperators)
        self.batches += 1
        self.input_rows += progress.numInputRows or 0
        self.late_rows += late
        log = logger.warning if late else logger.info
        log(
            "batch done",
            query=progress.name,
            batch_id=progress.batchId,
            input_rows=progress.numInputRows,
            late_rows_dropped=late,
            duration_ms=dict(progress.durationMs or {}),
            state_rows=sum(op.numRowsTotal or 0 for op in progress.stateOperators),
        )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            logger.error("query failed", id=str(event.id), error=event.exception)


def await_query(
    query: StreamingQuery,
    *,
    stop: threading.Event | None = None,
    writer: BatchWriter | None = None,
    progress: ProgressLog | None = None,
) -> QueryReport:
    """Wait until the query ends (available-now) or ``stop`` is set (then stop it).

    A failed query raises :class:`PipelineError`. When ``stop`` is set and Spark's JVM is
    already gone, the report is what ``progress`` counted (see :func:`_stopped_with_the_jvm`)."""
    stop = stop or threading.Event()
    name = query.name or str(query.id)
    try:
        try:
            while query.isActive and not stop.wait(0.5):
                pass
        finally:
            if query.isActive:
                query.stop()
        error = query.exception()
        result = None if error else report(query, writer)
    except _JVM_GONE as exc:
        if not stop.is_set():
            raise
        return _stopped_with_the_jvm(name, exc, writer, progress)
    if result is None:
        raise PipelineError(f"query {name} failed: {error}")
    logger.info("query finished", **result.__dict__)
    return result


def _stopped_with_the_jvm(
    name: str,
    error: Py4JError | ConnectionError,
    writer: BatchWriter | None,
    progress: ProgressLog | None,
) -> QueryReport:
    """The stop signal reached Spark's JVM too — SIGTERM to the whole process group, as systemd
    (``KillMode=control-group``) and a shell's ``kill -TERM -<pgid>`` send it — and its shutdown
    hook stopped the SparkContext, and the query with it, before the driver could. That is a
    stop, not a failure: batches not committed are re-run from the checkpoint at the next
    start, and the sinks skip what they already wrote."""
    logger.warning(
        "query stopped with Spark's JVM",
        query=name,
        reason=str(error).strip().splitlines()[0][:200],
    )
    seen = progress or ProgressLog()
    return QueryReport(
        name=name,
        batches=seen.batches,
        input_rows=seen.input_rows,
        late_rows=seen.late_rows,
        step_seconds=dict(writer.seconds) if writer else {},
    )


def run(
    pipeline: Pipeline,
    settings: PipelineSettings,
    *,
    spark: SparkSession | None = None,
    stop: threading.Event | None = None,
) -> QueryReport:
    """Run ``pipeline`` until the backlog is done (available-now) or ``stop`` is set."""
    if spark is None:
        spark = build_session(settings)
    else:
        configure_session(spark, shuffle_partitions=settings.spark_shuffle_partitions)
    listener = ProgressLog()
    spark.streams.addListener(listener)
    try:
        writer = BatchWriter(pipeline, settings)
        query = start(spark, pipeline, settings, writer=writer)
        return await_query(query, stop=stop, writer=writer, progress=listener)
    finally:
        with suppress(*_JVM_GONE):  # the JVM may be gone already (see await_query)
            spark.streams.removeListener(listener)
