"""W3C trace context through the outbox: one request is one trace, from the HTTP handler that
writes an event to the inbox handler that takes its effect.

- The writer: :func:`trace_headers` gives the current span's ``traceparent`` (and
  ``tracestate``); :func:`outboxkit.schemas.encode` — which every writer calls (PostgreSQL,
  in-memory, MongoDB) — stores them with the record's headers.
- The relay sends stored headers as they are: the Kafka record carries ``traceparent``.
- The inbox: :func:`consumer_span` runs the handler in a ``CONSUMER`` span whose parent is the
  record's ``traceparent``; events the handler writes in turn carry that span's context.
- The Spark pipeline sees ``traceparent`` in the ``headers`` of each decoded event.

OpenTelemetry is optional (``pip install 'outboxkit[otel]'``) and used only when the process
already uses it, i.e. has imported ``opentelemetry.trace`` (a configured SDK, an
instrumentation, or your own spans do). Otherwise nothing changes and outboxkit imports
nothing of it: no span can be current in a process that never imported the API.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The headers :func:`trace_headers` may give (W3C Trace Context).
TRACE_HEADERS = (TRACEPARENT, TRACESTATE)

_INSTRUMENTATION = "outboxkit"


def in_use() -> bool:
    """Whether this process uses OpenTelemetry (has imported its tracing API)."""
    return "opentelemetry.trace" in sys.modules


def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    return TraceContextTextMapPropagator()


def trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the current span; empty without a valid span,
    or when the process does not use OpenTelemetry."""
    if not in_use():
        return {}
    carrier: dict[str, str] = {}
    _propagator().inject(carrier)
    return {name: value for name, value in carrier.items() if name in TRACE_HEADERS}


@contextmanager
def consumer_span(
    name: str, headers: Mapping[str, str], attributes: Mapping[str, str | int]
) -> Iterator[None]:
    """A ``CONSUMER`` span around the block, child of the ``traceparent`` in ``headers`` (a new
    trace without one). Does nothing when the process does not use OpenTelemetry. An exception
    of the block is recorded on the span and raised as it is."""
    if not in_use():
        yield
        return
    from opentelemetry import trace  # noqa: PLC0415

    parent = _context_of(headers)
    tracer = trace.get_tracer(_INSTRUMENTATION)
    with tracer.start_as_current_span(
        name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=dict(attributes)
    ):
        yield


@contextmanager
def consumer_batch_span(
    name: str, headers: Sequence[Mapping[str, str]], attributes: Mapping[str, str | int]
) -> Iterator[None]:
    """A ``CONSUMER`` span around the block that processes several messages at once: a new
    trace, linked to each ``traceparent`` in ``headers`` (OpenTelemetry's way for a batch).
    Does nothing when the process does not use OpenTelemetry."""
    if not in_use():
        yield
        return
    from opentelemetry import trace  # noqa: PLC0415

    contexts = (trace.get_current_span(_context_of(h)).get_span_context() for h in headers)
    links = [trace.Link(context) for context in contexts if context.is_valid]
    tracer = trace.get_tracer(_INSTRUMENTATION)
    with tracer.start_as_current_span(
        name, kind=trace.SpanKind.CONSUMER, links=links, attributes=dict(attributes)
    ):
        yield


def _context_of(headers: Mapping[str, str]) -> Any:
    """The trace context that ``headers``' ``traceparent`` (and ``tracestate``) carry."""
    return _propagator().extract({k: v for k, v in headers.items() if k in TRACE_HEADERS})
