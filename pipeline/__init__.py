"""The Spark pipeline: PySpark Structured Streaming over the outbox topics (``[spark]`` extra).

The same events the inbox consumes, decoded by the same registry, deduplicated by event id
within a watermark, written by idempotent sinks. See docs/spark.md.

Importing this package does not import pyspark; the names that need it are loaded on first
use, so ``outboxkit`` and its CLI work without the ``[spark]`` extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from outboxkit.pipeline.exceptions import (
    ConnectorUnavailableError,
    PipelineError,
    SchemaMappingError,
)
from outboxkit.pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from outboxkit.pipeline.decode import RecordDecoder, event_column
    from outboxkit.pipeline.jars import fetch_connector
    from outboxkit.pipeline.pipeline import (
        QueryReport,
        decode,
        deduplicated,
        quarantined,
        read_kafka,
        run_pipeline,
        start_pipeline,
        valid_events,
    )
    from outboxkit.pipeline.schema import spark_schema
    from outboxkit.pipeline.sinks import PostgresBatchSink

_LAZY = {
    "PostgresBatchSink": "sinks",
    "QueryReport": "pipeline",
    "RecordDecoder": "decode",
    "decode": "pipeline",
    "deduplicated": "pipeline",
    "event_column": "decode",
    "fetch_connector": "jars",
    "quarantined": "pipeline",
    "read_kafka": "pipeline",
    "run_pipeline": "pipeline",
    "spark_schema": "schema",
    "start_pipeline": "pipeline",
    "valid_events": "pipeline",
}

__all__ = [
    "ConnectorUnavailableError",
    "PipelineError",
    "PipelineSettings",
    "PostgresBatchSink",
    "QueryReport",
    "RecordDecoder",
    "SchemaMappingError",
    "decode",
    "deduplicated",
    "event_column",
    "fetch_connector",
    "quarantined",
    "read_kafka",
    "run_pipeline",
    "spark_schema",
    "start_pipeline",
    "valid_events",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
