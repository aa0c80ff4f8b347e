"""The Spark pipeline: PySpark Structured Streaming over the outbox topics (``[spark]`` extra).

Your events (an :class:`~outboxkit.schemas.EventRegistry`), decoded once per micro-batch on the
JVM (the registry itself for what Spark SQL cannot decide), deduplicated by event id within a
watermark, and written by idempotent sinks: PostgreSQL and Delta Lake. See docs/spark.md.

Importing this package does not import pyspark; the names that need it are loaded on first
use, so ``outboxkit`` and its CLI work without the ``[spark]`` extra.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from outboxkit.pipeline.exceptions import (
    ConnectorUnavailableError,
    PipelineError,
    SchemaMappingError,
)
from outboxkit.pipeline.settings import PipelineSettings

if _TYPE_CHECKING:
    from outboxkit.pipeline.decoder import decode
    from outboxkit.pipeline.fallback import event_column
    from outboxkit.pipeline.jars import pipeline_jars
    from outboxkit.pipeline.job import (
        Output,
        Pipeline,
        QueryReport,
        deduplicated,
        quarantined,
        read_kafka,
        run,
        start,
        valid_events,
    )
    from outboxkit.pipeline.payload import jvm_decodable
    from outboxkit.pipeline.schema import spark_schema
    from outboxkit.pipeline.session import build_session
    from outboxkit.pipeline.sinks import BatchInfo, DeltaSink, PostgresSink, Sink

_LAZY = {
    "BatchInfo": "sinks",
    "DeltaSink": "sinks",
    "Output": "job",
    "Pipeline": "job",
    "PostgresSink": "sinks",
    "QueryReport": "job",
    "Sink": "sinks",
    "build_session": "session",
    "decode": "decoder",
    "deduplicated": "job",
    "event_column": "fallback",
    "jvm_decodable": "payload",
    "pipeline_jars": "jars",
    "quarantined": "job",
    "read_kafka": "job",
    "run": "job",
    "spark_schema": "schema",
    "start": "job",
    "valid_events": "job",
}

__all__ = [
    "BatchInfo",
    "ConnectorUnavailableError",
    "DeltaSink",
    "Output",
    "Pipeline",
    "PipelineError",
    "PipelineSettings",
    "PostgresSink",
    "QueryReport",
    "SchemaMappingError",
    "Sink",
    "build_session",
    "decode",
    "deduplicated",
    "event_column",
    "jvm_decodable",
    "pipeline_jars",
    "quarantined",
    "read_kafka",
    "run",
    "spark_schema",
    "start",
    "valid_events",
]


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
