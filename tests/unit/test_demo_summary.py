"""The demo's pure parts: percentiles, the per-key order check, the summary and its rendering,
the shop's orders."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from outboxkit.demo import shop
from outboxkit.demo.summary import (
    UNFENCED_NOTE,
    DemoSummary,
    KeyOrder,
    Latency,
    Progress,
    final_report,
    live_table,
    percentile,
)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.99) == 7
    assert percentile([], 0.5) is None


def test_latency_in_milliseconds() -> None:
    latency = Latency.of_seconds([0.010, 0.020, 0.030, 1.5])
    assert latency == Latency(count=4, p50=20.0, p99=1500.0, max=1500.0)
    assert str(latency) == "p50 20 ms  p99 1500 ms  max 1500 ms"
    assert str(Latency.of_seconds([])) == "-"


def test_key_order_allows_resends_of_the_latest_but_not_going_back() -> None:
    order = KeyOrder()
    for key, seq, event_id in [
        ("a", 0, "a0"),
        ("a", 1, "a1"),
        ("a", 1, "a1"),  # a re-send of the latest: R0 R1 R1
        ("b", 5, "b5"),
        ("a", 2, "a2"),
        ("a", 1, "a1"),  # a re-send after a newer one: allowed, it is not a first appearance
    ]:
        order.observe(key, seq, event_id)
    assert order.violations == []
    order.observe("a", 1, "a1-other")  # a first appearance older than a2: G2 broken
    assert order.violations == [("a", 2, 1)]


def summary(**changes: object) -> DemoSummary:
    values: dict[str, object] = {
        "broker": "tansu",
        "database": "postgresql",
        "transactional": False,
        "orders": 10,
        "events_written": 20,
        "events_published": 21,
        "duplicates_published": 1,
        "events_handled": 20,
        "duplicates_absorbed": 1,
        "dead_lettered": 0,
        "lost": 0,
        "key_order_violations": 0,
        "latency_ms": Latency.of_seconds([0.01, 0.02]),
        "round_trip_ms": Latency.of_seconds([0.03]),
        "relay_kills": 1,
        "takeover_seconds": [6.2],
        "seconds": 12.0,
        "pids": [1, 2],
        "workdir": "/tmp/x",
        "note": UNFENCED_NOTE,
    }
    values.update(changes)
    return DemoSummary(**values)  # type: ignore[arg-type]


def render(renderable: object) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(renderable)
    return buffer.getvalue()


def test_final_report_and_json() -> None:
    ok = summary()
    assert ok.ok
    assert ok.to_json()["ok"] is True
    assert ok.to_json()["latency_ms"] == {"count": 2, "p50": 10.0, "p99": 20.0, "max": 20.0}
    text = render(final_report(ok))
    assert "Nothing lost: all 20 events took effect exactly once" in text
    assert "took over after 6.2 s" in text
    assert "OUTBOXKIT_TRANSACTIONAL=false" in text
    lost = summary(events_handled=18, lost=2, note=None)
    assert not lost.ok
    assert "2 events were written and never handled" in render(final_report(lost))


def test_live_table_shows_resends_and_dead_letters() -> None:
    text = render(
        live_table(Progress(published=12, published_distinct=10, dead_lettered=1), "demo")
    )
    assert "12  (2 re-sent)" in text
    assert "dead-lettered" in text


@pytest.mark.parametrize("customers", [1, 7, 20])
def test_orders_are_valid_and_each_customer_gets_increasing_indexes(customers: int) -> None:
    rng = random.Random(1)
    orders = [shop.make_order(i, customers, rng) for i in range(50)]
    for order in orders:
        assert order.amount == sum(line.unit_price * line.quantity for line in order.lines)
        assert order.topic == shop.ORDERS_TOPIC
    assert orders[3].order_id == "o-000003"
    assert len({o.customer_id for o in orders}) == min(customers, 50)
    assert orders[0].customer_id == orders[customers].customer_id
