"""Trace propagation (core/tracing.py): the writer's span travels in the record's headers and
the inbox continues it; without OpenTelemetry nothing changes and nothing of it is imported.

The spans are recorded by the SDK's in-memory exporter, installed once for this process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outboxkit.inbox import Inbox
from outboxkit.relay import InMemoryOutboxStorage
from outboxkit.schemas import Event, encode
from tests.spans import TRACER as _TRACER
from tests.spans import install


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return install()


class OrderPlaced(Event, type="tests.order_placed", topic="orders", key_field="order_id"):
    order_id: str


def _headers(record: Any) -> dict[str, str]:
    return {name: value.decode() for name, value in record.headers}


def test_the_writer_stores_the_current_span_as_traceparent(spans: InMemorySpanExporter) -> None:
    with _TRACER.start_as_current_span("POST /orders") as span:
        record = encode(OrderPlaced(order_id="o-1"), source="urn:test")
    context = span.get_span_context()
    assert _headers(record)["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )


def test_outside_any_span_no_traceparent_is_written(spans: InMemorySpanExporter) -> None:
    assert "traceparent" not in _headers(encode(OrderPlaced(order_id="o-1"), source="urn:test"))


def test_an_explicit_traceparent_header_of_the_event_wins(spans: InMemorySpanExporter) -> None:
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with _TRACER.start_as_current_span("POST /orders"):
        record = encode(
            OrderPlaced(order_id="o-1", headers={"traceparent": given}), source="urn:test"
        )
    assert [v for n, v in record.headers if n == "traceparent"] == [given.encode()]


async def test_the_in_memory_writer_and_the_relays_record_carry_it(
    spans: InMemorySpanExporter,
) -> None:
    storage = InMemoryOutboxStorage()
    await storage.register_topics({"orders": 3})
    with _TRACER.start_as_current_span("POST /orders") as span:
        record = storage.add(OrderPlaced(order_id="o-1"))
    trace_id = f"{span.get_span_context().trace_id:032x}"
    # The relay publishes a record's stored headers as they are (relay/publisher.py).
    assert trace_id in _headers(record)["traceparent"]


async def test_the_inbox_runs_the_handler_in_a_consumer_span_of_the_writers_trace(
    spans: InMemorySpanExporter,
) -> None:
    inbox = Inbox("payments")
    seen: list[int] = []

    @inbox.handler(OrderPlaced)
    async def handle(event: OrderPlaced, tx: Any) -> None:
        seen.append(trace.get_current_span().get_span_context().trace_id)

    with _TRACER.start_as_current_span("POST /orders") as request:
        record = encode(OrderPlaced(order_id="o-1"), source="urn:test")
    event = inbox.registry.decode(
        topic=record.topic, key=record.key, value=record.value, headers=record.headers
    )
    assert event.headers["traceparent"]  # decoded events keep it (the Spark pipeline too)
    handler = inbox.handler_for(event)
    assert handler is not None
    await handler(event, None)

    consumer = next(s for s in spans.get_finished_spans() if s.name == "orders process")
    assert consumer.kind is trace.SpanKind.CONSUMER
    assert consumer.parent is not None
    assert consumer.parent.span_id == request.get_span_context().span_id
    assert consumer.context.trace_id == request.get_span_context().trace_id == seen[0]
    assert consumer.attributes is not None
    assert consumer.attributes["messaging.message.id"] == str(event.id)
    assert consumer.attributes["messaging.consumer.group.name"] == "outboxkit.inbox.payments"


async def test_a_raising_handler_marks_its_span_as_failed(spans: InMemorySpanExporter) -> None:
    inbox = Inbox("payments")

    @inbox.handler(OrderPlaced)
    async def handle(event: OrderPlaced, tx: Any) -> None:
        raise RuntimeError("card declined")

    handler = inbox.handler_for(OrderPlaced(order_id="o-1"))
    assert handler is not None
    with pytest.raises(RuntimeError, match="card declined"):
        await handler(OrderPlaced(order_id="o-1"), None)
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR


async def test_a_batch_handler_runs_in_one_consumer_span_linked_to_each_events_trace(
    spans: InMemorySpanExporter,
) -> None:
    inbox = Inbox("payments")

    @inbox.batch_handler(OrderPlaced)
    async def handle(events: Sequence[OrderPlaced], tx: Any) -> None:
        pass

    requests, events = [], []
    for order in ("o-1", "o-2"):
        with _TRACER.start_as_current_span(f"POST /orders/{order}") as request:
            record = encode(OrderPlaced(order_id=order), source="urn:test")
        requests.append(request.get_span_context())
        events.append(
            inbox.registry.decode(
                topic=record.topic, key=record.key, value=record.value, headers=record.headers
            )
        )
    batch = inbox.batch_handler_for(events[0])
    assert batch is not None
    await batch(events, None)

    consumer = next(s for s in spans.get_finished_spans() if s.name == "orders process")
    assert consumer.kind is trace.SpanKind.CONSUMER
    linked = [(link.context.trace_id, link.context.span_id) for link in consumer.links]
    assert linked == [(r.trace_id, r.span_id) for r in requests]
    assert consumer.parent is None, "a batch is a trace of its own"
    assert consumer.attributes is not None
    assert consumer.attributes["messaging.batch.message_count"] == 2


# The other way: a process without OpenTelemetry (blocked from importing it, as if the [otel]
# extra were not installed), and a process that has it installed but does not use it.
_WITHOUT = """
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

if BLOCK:
    sys.meta_path.insert(0, Block())

from outboxkit.inbox import Inbox
from outboxkit.schemas import Event, encode

class OrderPlaced(Event, type="tests.order_placed", topic="orders", key_field="order_id"):
    order_id: str

inbox = Inbox("payments")

@inbox.handler(OrderPlaced)
async def handle(event, tx):
    pass

event = OrderPlaced(order_id="o-1")
record = encode(event, source="urn:test")
print(json.dumps({
    "headers": [name for name, _ in record.headers],
    "imported": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
    "handler_unchanged": inbox.handler_for(event) is handle,
}))
"""


@pytest.mark.parametrize("block", [True, False], ids=["not installed", "installed, unused"])
def test_without_opentelemetry_nothing_changes_and_nothing_is_imported(block: bool) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"BLOCK = {block}\n{_WITHOUT}"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(result.stdout)
    assert found["imported"] == []
    assert found["handler_unchanged"] is True
    assert found["headers"] == [
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
        "ce_schemaversion",
        "content-type",
        "ce_dataschema",
    ]
