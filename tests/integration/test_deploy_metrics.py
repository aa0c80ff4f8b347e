"""The alert rules and the dashboard (``deploy/``) against live workers: one ``outboxkit relay``
and one ``outboxkit inbox`` process, given the traffic that makes them export every metric the
rules and the dashboard read (events published and handled, a duplicate, a handler that fails
until its event is dead-lettered, a producer ahead of the inbox's model, a record the Kafka
client cannot read, a record the broker refuses until the relay parks it); their ``/metrics``
must then hold every metric name, with every label, the queries use (:mod:`tests.deploy`).

Three families only a fault exports samples of are not provoked here, each named in
:data:`NOT_PROVOKED` with why: for them the scrape must show the family, and the labels the
queries use must be those the code declares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from pydantic import Field

from outboxkit.embedded._process import free_port
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.relay.metrics import ORDER_HOLDS
from outboxkit.schemas import Event, encode
from tests import deploy
from tests.helpers import http_client, wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import FAILING_ENTITY, Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    inbox_env,
    produce,
    produce_raw_batch,
)
from tests.integration.relay_harness import Big, RelayProcess, register_topic, relay_env
from tests.integration.step_writers import step_writer

#: Sample name → why this run does not make it, and the labels the code declares for it.
NOT_PROVOKED: dict[str, tuple[str, tuple[str, ...]]] = {
    "outboxkit_relay_order_holds_total": (
        "MongoDB's order barrier, when a read shows a later record of a key without the older",
        tuple(ORDER_HOLDS._labelnames),
    ),
    "outboxkit_inbox_storage_errors_total": (
        "the inbox database not answering",
        tuple(InboxMetrics(CollectorRegistry()).storage_errors._labelnames),
    ),
    "outboxkit_inbox_parked": (
        "a record that cannot be dead-lettered for good (also set to 0 when a partition is "
        "revoked, which one worker alone never is)",
        tuple(InboxMetrics(CollectorRegistry()).parked._labelnames),
    ),
}


class PaymentAhead(Event, type="test.payment", key_field="entity"):
    """``Payment`` as a producer ahead of the inbox's model writes it: one more field."""

    entity: str
    seq: int
    amount: int = Field(default=1, ge=0)
    note: str = "new"


def _scrape(text: str, labels: dict[str, frozenset[str]], sampled: set[str]) -> None:
    """Add each sample name of ``text`` to ``sampled`` and its label names (with the target's,
    which Prometheus adds) to ``labels``; a family without samples under its sample name, with
    the target's labels only."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sampled.add(sample.name)
            have = labels.get(sample.name, deploy.TARGET_LABELS)
            labels[sample.name] = have | frozenset(sample.labels)
    for family, kind in re.findall(r"^# TYPE (\S+) (counter|gauge)$", text, flags=re.MULTILINE):
        # The text format names a counter's family with or without its samples' _total.
        total = kind == "counter" and not family.endswith("_total")
        labels.setdefault(f"{family}_total" if total else family, deploy.TARGET_LABELS)


async def test_every_metric_and_label_the_rules_and_dashboard_use_is_exported(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic("deploy", partitions=2, config={"max.message.bytes": "4096"})
    await make_topic(name=f"{topic}.dlq")
    await create_effects_table(pg_url)
    await register_topic(pg_url, topic, 2)
    writer = step_writer(pg_url)
    try:
        for i in range(6):
            await writer.write(Payment(topic=topic, entity=f"e{i % 3}", seq=i))
        await writer.write(Payment(topic=topic, entity=FAILING_ENTITY, seq=0))
        await writer.write(Big(topic=topic, entity="big", blob="x" * 8000))  # over 4096 bytes
    finally:
        await writer.close()
    twice = Payment(topic=topic, entity="twice", seq=0)
    await produce(kafka_bootstrap, [twice, twice, PaymentAhead(topic=topic, entity="e9", seq=0)])
    value = encode(Payment(topic=topic, entity="raw", seq=0), source="urn:test")
    headers = [(name.encode(), header) for name, header in value.headers]
    await produce_raw_batch(
        kafka_bootstrap, topic, [(value.key, value.value, [*headers, (b"bad\xff", b"x")])]
    )

    relay_port, inbox_port = free_port(), free_port()
    relay = RelayProcess(
        tmp_path,
        relay_env(
            pg_url,
            kafka_bootstrap,
            topic,
            OUTBOXKIT_HTTP_PORT=str(relay_port),
            OUTBOXKIT_MAX_ATTEMPTS="1",
        ),
    ).start()
    inbox = InboxProcess(
        tmp_path,
        inbox_env(
            pg_url,
            kafka_bootstrap,
            topic,
            OUTBOXKIT_HTTP_PORT=str(inbox_port),
            OUTBOXKIT_CLEANUP_INTERVAL="1",
        ),
    ).start()
    queries = deploy.rule_queries() + deploy.dashboard_queries()
    wanted = {name for name in deploy.used_metrics(queries) if ":" not in name}
    scraped: dict[str, frozenset[str]] = {}
    sampled: set[str] = set()

    async def everything_exported() -> bool:
        scraped.clear()
        sampled.clear()
        async with http_client(timeout=5) as http:
            for port in (relay_port, inbox_port):
                try:
                    response = await http.get(f"http://127.0.0.1:{port}/metrics")
                except httpx.TransportError:
                    return False  # not serving yet
                _scrape(response.text, scraped, sampled)
        return wanted <= sampled | NOT_PROVOKED.keys()

    try:
        await wait_for(everything_exported, within=60, interval=0.5, what="every metric sampled")
    except AssertionError:
        missing = sorted(wanted - sampled - NOT_PROVOKED.keys())
        raise AssertionError(
            f"not exported with samples: {missing}\n--- relay\n{relay.log()[-3000:]}"
            f"\n--- inbox\n{inbox.log()[-3000:]}"
        ) from None
    finally:
        relay.kill()
        inbox.kill()

    for name, (why, labels) in NOT_PROVOKED.items():
        assert name in scraped, f"{name} ({why}) is not even declared in /metrics"
        assert name not in sampled, f"{name} was sampled after all: drop it from NOT_PROVOKED"
        assert name in wanted, f"{name} is no longer used: drop it from NOT_PROVOKED"
        scraped[name] = scraped[name] | frozenset(labels)
    problems = deploy.check(deploy.rule_queries(), scraped)
    problems += deploy.check(deploy.dashboard_queries(), scraped)
    assert not problems, json.dumps(problems, indent=1)
