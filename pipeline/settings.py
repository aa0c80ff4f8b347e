"""The pipeline's settings: one validated, frozen object (``OUTBOXKIT_*`` environment variables).

Importing this module does not import pyspark: the CLI validates settings (and exits 2 on bad
ones) before it starts a JVM.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator

from outboxkit.core.settings import CommaList, Duration, KafkaConnectionSettings

AVAILABLE_NOW: Literal["available-now"] = "available-now"


def spark_duration(value: timedelta) -> str:
    """A duration as Spark's interval text (``"3600000 milliseconds"``)."""
    return f"{round(value.total_seconds() * 1000)} milliseconds"


class PipelineSettings(KafkaConnectionSettings):
    """Where the pipeline reads, where it writes, and how it treats time. Kafka's brokers and
    security settings are the same as every other component's (:mod:`.kafka_options`)."""

    topics: CommaList = Field(
        default=[],
        description="Topics the pipeline reads, comma-separated; by default the default "
        "topics of the job's event models",
    )
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL database of the PostgreSQL sinks (postgresql://…)",
    )
    pipeline_job: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="The job `outboxkit pipeline run` runs, as module:name: a Pipeline, or a "
        "function of the PipelineSettings that returns one "
        "(e.g. outboxkit.demo.pipeline:order_totals, the demo's)",
    )
    pipeline_name: str = Field(
        default="outboxkit",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Name of the pipeline: its streaming query and checkpoint subdirectory",
    )
    pipeline_output: str = Field(
        description="Directory or URI (file:, hdfs:, s3a:…) under which the pipeline writes its "
        "Delta tables (quarantine/, and the job's relative DeltaSink paths)",
    )
    pipeline_checkpoint: str | None = Field(
        default=None,
        description="Checkpoint root (the query uses <root>/<pipeline_name>); "
        "<pipeline_output>/_checkpoints when not set. Reuse it to resume; never share it "
        "between two running pipelines",
    )
    pipeline_trigger: Literal["available-now"] | Duration = Field(
        default=AVAILABLE_NOW,
        description="available-now (process the backlog in micro-batches, then stop) or an "
        "interval in seconds or ISO 8601 (run until stopped, one micro-batch per interval)",
    )
    pipeline_watermark: Duration = Field(
        default=timedelta(hours=1),
        description="How far behind the newest event time an event may arrive and still count; "
        "also how long an event id is remembered for dropping duplicates",
    )
    pipeline_starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where a new checkpoint starts reading (ignored when resuming one)",
    )
    pipeline_stop_grace: Duration = Field(
        default=timedelta(seconds=25),
        description="How long `outboxkit pipeline run` lets the running micro-batch finish "
        "after SIGTERM/SIGINT before it exits anyway (the batch re-runs at the next start); "
        "keep it below the supervisor's own kill timeout (Kubernetes 30 s, systemd 90 s)",
    )
    pipeline_max_offsets_per_trigger: int | None = Field(
        default=None, ge=1, description="At most this many records per micro-batch"
    )
    spark_master: str = Field(
        default="local[*]",
        description="Spark master of `outboxkit pipeline run` (spark-submit sets its own)",
    )
    spark_jars: str | None = Field(
        default=None,
        description="Directory of every jar a local run needs (the Kafka connector and Delta "
        "Lake); fetched with Maven into ~/.cache/outboxkit when not set (spark-submit users "
        "pass --packages instead)",
    )
    spark_connector_version: str | None = Field(
        default=None,
        description="spark-sql-kafka-0-10 version to fetch; by default the installed pyspark's, "
        "or the newest published release of its major version before it",
    )
    spark_shuffle_partitions: int | None = Field(
        default=None,
        ge=1,
        description="spark.sql.shuffle.partitions (state store partitions; fixed by the first "
        "run of a checkpoint); 4 locally when not set, Spark's default under spark-submit",
    )

    @field_validator("database_url")
    @classmethod
    def _postgresql(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("the pipeline's PostgreSQL sinks need postgresql://…")
        return value

    @field_validator("pipeline_watermark", "pipeline_stop_grace")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than zero")
        return value

    @field_validator("pipeline_trigger")
    @classmethod
    def _positive_interval(cls, value: str | timedelta) -> str | timedelta:
        if isinstance(value, timedelta) and value <= timedelta(0):
            raise ValueError("give available-now or an interval longer than zero")
        return value

    @property
    def checkpoint(self) -> str:
        """The checkpoint root (each query uses a subdirectory named after it)."""
        return self.pipeline_checkpoint or f"{self.pipeline_output.rstrip('/')}/_checkpoints"

    def output(self, name: str) -> str:
        return f"{self.pipeline_output.rstrip('/')}/{name}"

    @property
    def available_now(self) -> bool:
        return self.pipeline_trigger == AVAILABLE_NOW
