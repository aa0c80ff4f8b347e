"""Errors of the Spark pipeline (``outboxkit.pipeline``).

PipelineError
├── SchemaMappingError         an event model has a field with no Spark type
└── ConnectorUnavailableError  the Spark Kafka connector jars could not be found or fetched

Records that do not decode are not errors: they go to the quarantine output.
"""

from outboxkit.core.exceptions import OutboxkitError


class PipelineError(OutboxkitError):
    """The Spark pipeline failed."""


class SchemaMappingError(PipelineError):
    """An event model cannot be mapped to a Spark schema."""


class ConnectorUnavailableError(PipelineError):
    """The Spark Kafka connector (spark-sql-kafka-0-10) is not available."""
