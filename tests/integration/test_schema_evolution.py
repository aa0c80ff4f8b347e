"""Events that evolve, deployed in either order (docs/schemas.md), against real PostgreSQL,
MongoDB and Apache Kafka: an inbox reads a stream mixing what the old and the new producer
wrote, in the same transaction as its effects and in per-key order.

- (a) an added optional field: producer first (the consumer's model does not know the field:
  ignored, counted) and consumer first (old records lack it: the default) — no dead letter;
- (b) version 1 → 2 with an upcaster, consumer first: v1 records in flight and from producers
  not yet upgraded are read as v2 — no dead letter;
- (b) producer first: a consumer that knows neither version 2 nor an upcaster dead-letters
  exactly the v2 records, naming the versions it knows, and goes on (never a crash loop); this
  is the order ``outboxkit schemas check --mode forward`` refuses (tests/unit);
- (c) a breaking change (a required field added to version 1, consumer first): the
  compatibility check names it, and the real inbox dead-letters exactly the records it says
  the new model cannot read.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from pymongo import AsyncMongoClient

from outboxkit.core.settings import ConnectionSettings
from outboxkit.inbox import Inbox, InboxSettings
from outboxkit.schemas import Event, EventRegistry
from outboxkit.schemas.compat.compatibility import Rule, check_compatibility
from outboxkit.schemas.compat.snapshot import Snapshot
from outboxkit.service import Outboxkit
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_harness import group_of, produce, read_all, wait_caught_up
from tests.timeouts import SERVICE_SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PARTITIONS = 2
KEYS = ["o1", "o2", "o3"]


class OrderOld(Event, type="evo.order", version=1, key_field="order_id"):
    """Version 1 as the service that has not been redeployed knows it."""

    order_id: str
    seq: int
    amount: int


class OrderNew(Event, type="evo.order", version=1, key_field="order_id"):
    """Version 1 with a field added by the producer team: optional, so the same version."""

    order_id: str
    seq: int
    amount: int
    coupon: str | None = None


class OrderRequired(Event, type="evo.order", version=1, key_field="order_id"):
    """Version 1 with a field added *without* a default: older records lack it."""

    order_id: str
    seq: int
    amount: int
    coupon: str


class OrderV2(Event, type="evo.order", version=2, key_field="order_id"):
    """Version 2: the amount in a currency, a breaking change of the payload."""

    order_id: str
    seq: int
    total: Decimal
    currency: str


def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    amount = payload.pop("amount")
    payload.pop("coupon", None)
    return {**payload, "total": str(Decimal(amount) / 100), "currency": "EUR"}


#: Handling order across this process's inboxes.
_handled = itertools.count()


async def record(tx: Any, event: Event, value: str) -> None:
    """The handler's effect, in the inbox's transaction (``tx``: a psycopg connection or a
    MongoDB session)."""
    row = (event.id, event.key, event.seq, value, next(_handled))  # type: ignore[attr-defined]
    if isinstance(tx, psycopg.AsyncConnection):
        await tx.execute(
            "INSERT INTO evolution_effects (event_id, order_id, seq, value, n) "
            "VALUES (%s, %s, %s, %s, %s)",
            row,
        )
    else:
        effects = tx.client.get_default_database()["evolution_effects"]
        fields = ("event_id", "order_id", "seq", "value", "n")
        await effects.insert_one(dict(zip(fields, row, strict=True)), session=tx)


def consumer(name: str, model: type[Event], *, upcast: bool = False) -> Inbox[Any]:
    inbox: Inbox[Any] = Inbox(name)

    @inbox.handler(model)
    async def handle(event: Any, tx: Any) -> None:
        if isinstance(event, OrderV2):
            await record(tx, event, f"{event.total} {event.currency}")
        else:
            await record(tx, event, f"{event.amount} {getattr(event, 'coupon', '-')}")

    if upcast:
        inbox.registry.upcaster(OrderV2, from_version=1)(v1_to_v2)
    return inbox


async def effects(url: str) -> list[dict[str, Any]]:
    """The effects, in handling order."""
    if url.startswith("mongodb"):
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            url, uuidRepresentation="standard"
        )
        try:
            found = client.get_default_database()["evolution_effects"].find({}, {"_id": 0})
            return sorted([doc async for doc in found], key=lambda doc: doc["n"])
        finally:
            await client.close()
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT event_id, order_id, seq, value, n FROM evolution_effects ORDER BY n"
        )
        names = ("event_id", "order_id", "seq", "value", "n")
        return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]


async def create_effects(url: str) -> None:
    if url.startswith("mongodb"):
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
        try:
            await client.get_default_database().create_collection("evolution_effects")
        finally:
            await client.close()
        return
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE evolution_effects "
            "(event_id uuid, order_id text, seq int, value text, n int)"
        )


async def consume(
    url: str, kafka: str, topic: str, inbox: Inbox[Any], metrics: CollectorRegistry
) -> None:
    """Run ``inbox`` (as a service's lifespan would) until it has taken every record."""
    kit = Outboxkit(
        source="payments",
        settings=ConnectionSettings(database_url=url),
        inbox=inbox,
        inbox_settings=InboxSettings(
            database_url=url, kafka_bootstrap_servers=[kafka], topics=[topic], **SERVICE_SETTINGS
        ),
        registry=metrics,
    )
    async with kit.lifespan():
        await wait_caught_up(
            kafka, group_of(topic), topic, PARTITIONS, within=60, what="the inbox caught up"
        )
        assert kit.health().healthy, kit.health()


def stream(topic: str, *makers: Any) -> list[Event]:
    """Events on every key, each maker's in turn (seq 0, 1, 2… per key across them)."""
    counters = dict.fromkeys(KEYS, 0)
    events: list[Event] = []
    for make in makers:
        for key in KEYS:
            events.append(make(topic=topic, order_id=key, seq=counters[key]))
            counters[key] += 1
    return events


def assert_in_key_order(found: Sequence[dict[str, Any]]) -> None:
    for key in KEYS:
        seqs = [effect["seq"] for effect in found if effect["order_id"] == key]
        assert seqs == sorted(seqs), f"{key} handled out of order: {seqs}"


async def assert_split(
    url: str,
    kafka: str,
    dlq: str,
    events: Sequence[Event],
    *,
    handled: type[Event],
    lettered: type[Event],
    reason: str,
    message: str,
) -> None:
    """The ``handled`` events took effect and exactly the ``lettered`` ones are dead letters,
    each with ``reason`` and ``message``."""
    found = await effects(url)
    assert sorted(e["event_id"] for e in found) == sorted(
        e.id for e in events if isinstance(e, handled)
    )
    letters = await read_all(kafka, dlq)
    assert sorted(uuid.UUID(dict(r.headers)["ce_id"].decode()) for r in letters) == sorted(
        e.id for e in events if isinstance(e, lettered)
    )
    for letter in letters:
        headers = dict(letter.headers)
        assert headers["outboxkit-error-reason"] == reason.encode()
        assert message.encode() in headers["outboxkit-error-message"]


async def setup(url: str, make_topic: MakeTopic) -> tuple[str, str]:
    topic = await make_topic("evolution", partitions=PARTITIONS)
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects(url)
    return topic, dlq


def old(**fields: Any) -> OrderOld:
    return OrderOld(amount=1250, **fields)


def new(**fields: Any) -> OrderNew:
    return OrderNew(amount=1250, coupon="SPRING", **fields)


def v2(**fields: Any) -> OrderV2:
    return OrderV2(total=Decimal("12.50"), currency="USD", **fields)


async def test_an_added_field_producer_first(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic, dlq = await setup(db_url, make_topic)
    events = stream(topic, old, new, old, new)  # new producers beside old ones
    await produce(kafka_bootstrap, events)
    metrics = CollectorRegistry()
    await consume(db_url, kafka_bootstrap, topic, consumer(topic, OrderOld), metrics)
    found = await effects(db_url)
    assert [e["event_id"] for e in found] != []
    assert sorted(e["event_id"] for e in found) == sorted(e.id for e in events)
    assert {e["value"] for e in found} == {"1250 -"}  # the old model knows no coupon
    assert_in_key_order(found)
    assert await read_all(kafka_bootstrap, dlq) == []
    ignored = metrics.get_sample_value(
        "outboxkit_inbox_unknown_fields_total",
        {"inbox": topic, "type": "evo.order", "version": "1"},
    )
    assert ignored == 2 * len(KEYS)


async def test_an_added_field_consumer_first(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic, dlq = await setup(db_url, make_topic)
    events = stream(topic, old, old, new)  # records in flight, then the upgraded producer
    await produce(kafka_bootstrap, events)
    await consume(db_url, kafka_bootstrap, topic, consumer(topic, OrderNew), CollectorRegistry())
    found = await effects(db_url)
    assert sorted(e["event_id"] for e in found) == sorted(e.id for e in events)
    values = [e["value"] for e in found if e["order_id"] == "o1"]
    assert values == ["1250 None", "1250 None", "1250 SPRING"]
    assert_in_key_order(found)
    assert await read_all(kafka_bootstrap, dlq) == []


async def test_a_new_version_consumer_first_reads_v1_through_the_upcaster(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic, dlq = await setup(db_url, make_topic)
    # v1 in flight, a producer still on v1 (with the added field), then v2.
    events = stream(topic, old, new, v2, old, v2)
    await produce(kafka_bootstrap, events)
    await consume(
        db_url, kafka_bootstrap, topic, consumer(topic, OrderV2, upcast=True), CollectorRegistry()
    )
    found = await effects(db_url)
    assert sorted(e["event_id"] for e in found) == sorted(e.id for e in events)
    values = [e["value"] for e in found if e["order_id"] == "o2"]
    assert values == ["12.5 EUR", "12.5 EUR", "12.50 USD", "12.5 EUR", "12.50 USD"]
    assert_in_key_order(found)
    assert await read_all(kafka_bootstrap, dlq) == []


async def test_a_new_version_producer_first_dead_letters_only_what_the_consumer_cannot_read(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic, dlq = await setup(db_url, make_topic)
    events = stream(topic, old, v2, old)
    await produce(kafka_bootstrap, events)
    await consume(db_url, kafka_bootstrap, topic, consumer(topic, OrderOld), CollectorRegistry())
    await assert_split(
        db_url,
        kafka_bootstrap,
        dlq,
        events,
        handled=OrderOld,
        lettered=OrderV2,
        reason="unsupported_version",
        message="has no version 2; known versions: 1",
    )


async def test_a_breaking_change_the_check_names_is_what_the_inbox_dead_letters(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    before = EventRegistry()
    before.register(OrderOld)
    after = EventRegistry()
    after.register(OrderRequired)
    report = check_compatibility(after, Snapshot.of_registry(before), "backward")
    assert [(f.rule, f.path) for f in report.breaking] == [(Rule.REQUIRED_FIELD_ADDED, "coupon")]

    topic, dlq = await setup(db_url, make_topic)
    events = stream(topic, old, new)  # records the old producer wrote, then the new one's
    await produce(kafka_bootstrap, events)
    await consume(
        db_url, kafka_bootstrap, topic, consumer(topic, OrderRequired), CollectorRegistry()
    )
    await assert_split(
        db_url,
        kafka_bootstrap,
        dlq,
        events,
        handled=OrderNew,
        lettered=OrderOld,
        reason="invalid_payload",
        message="coupon: Field required",
    )
