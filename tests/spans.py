"""One OpenTelemetry SDK provider for the whole test session (the global provider can be set
once per process), recording into an in-memory exporter."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
TRACER = PROVIDER.get_tracer("tests")


def install() -> InMemorySpanExporter:
    """Make :data:`PROVIDER` the global one (once) and empty the exporter."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(PROVIDER)
    EXPORTER.clear()
    return EXPORTER
