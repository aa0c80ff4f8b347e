"""One request, one trace, through the real servers: a span open while the writer commits an
event → the relay publishes the record with its traceparent → an inbox worker runs the handler
in a consumer span that is a child of the writer's span (docs/tracing.md)."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from outboxkit.inbox import Inbox
from outboxkit.schemas import Event
from outboxkit.testing import Broker, OutboxkitHarness
from tests.spans import TRACER, install

pytestmark = pytest.mark.timeout(180)


class Traced(Event, type="tests.traced", topic="traced", key_field="name"):
    name: str


async def test_the_handler_continues_the_writers_trace_across_kafka(
    pg_url: str, kafka_bootstrap: str
) -> None:
    spans = install()
    inbox = Inbox("traced")
    handled: list[int] = []

    @inbox.handler(Traced)
    async def handle(event: Traced, tx: object) -> None:
        handled.append(trace.get_current_span().get_span_context().trace_id)

    async with OutboxkitHarness(pg_url, Broker(kafka_bootstrap)) as harness:
        await harness.create_topics("traced", partitions=1)
        with TRACER.start_as_current_span("POST /things") as request:
            await harness.add(Traced(name="a"))
        await harness.run_relay_until_empty()
        [published] = await harness.published(Traced)
        context = request.get_span_context()
        assert published.headers["traceparent"].split("-")[1:3] == [
            f"{context.trace_id:032x}",
            f"{context.span_id:016x}",
        ]
        await harness.run_inbox_until_idle(inbox)

    assert handled == [context.trace_id]
    [consumer] = [s for s in spans.get_finished_spans() if s.name == "traced process"]
    assert consumer.kind is trace.SpanKind.CONSUMER
    assert consumer.parent is not None
    assert consumer.parent.span_id == context.span_id
