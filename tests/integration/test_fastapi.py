"""outboxkit embedded in FastAPI apps, against real PostgreSQL and Apache Kafka: an orders app
writes orders and events through its lifespan's writer and runs the relay; a payments app runs
the inbox. Effects exactly once (also under a replay), drain on shutdown, health turns red when
a background task dies."""

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Annotated, Any

import httpx
import psycopg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from outboxkit.core.settings import ConnectionSettings
from outboxkit.demo.events import Currency, OrderLine, OrderPlaced
from outboxkit.fastapi import health_router, running
from outboxkit.inbox import Inbox, InboxSettings
from outboxkit.relay import PostgresOutboxOperations, RelaySettings
from outboxkit.service import Outboxkit
from tests.helpers import wait_for
from tests.integration.conftest import MakeTopic
from tests.timeouts import SERVICE_SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def orders_app(kit: Outboxkit, topic: str) -> FastAPI:
    app = FastAPI(lifespan=kit.lifespan)
    app.include_router(health_router(kit))
    Kit = Annotated[Outboxkit, Depends(running(kit))]

    @app.post("/orders")
    async def place_order(body: dict[str, Any], kit: Kit) -> dict[str, str]:
        order_id = str(uuid.uuid4())
        amount = Decimal(body["amount"])
        async with kit.transaction() as tx:
            await tx.execute(
                "INSERT INTO shop_orders (order_id, customer_id, amount) VALUES (%s, %s, %s)",
                (order_id, body["customer_id"], amount),
            )
            await kit.add(tx, placed(order_id, body["customer_id"], amount, topic))
        return {"order_id": order_id}

    return app


def placed(order_id: str, customer_id: str, amount: Decimal, topic: str) -> OrderPlaced:
    return OrderPlaced(
        topic=topic,
        order_id=order_id,
        customer_id=customer_id,
        currency=Currency.EUR,
        lines=[OrderLine(sku="sku-1", quantity=1, unit_price=amount)],
        amount=amount,
    )


def payments_inbox(name: str) -> Inbox:
    inbox = Inbox(name)

    @inbox.handler(OrderPlaced)
    async def charge(event: OrderPlaced, tx: psycopg.AsyncConnection[Any]) -> None:
        await tx.execute(
            "INSERT INTO shop_payments (event_id, order_id, amount) VALUES (%s, %s, %s)",
            (event.id, event.order_id, event.amount),
        )

    return inbox


async def create_tables(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE shop_orders (order_id text PRIMARY KEY, customer_id text, amount numeric)"
        )
        # No unique constraint: a second effect of an event must be visible, not an error.
        await conn.execute(
            "CREATE TABLE shop_payments (event_id uuid, order_id text, amount numeric)"
        )


async def count(pg_url: str, sql: str) -> int:
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        row = await (await conn.execute(sql)).fetchone()
        assert row is not None
        return int(row[0])


def relay_settings(pg_url: str, kafka: str, topic: str) -> RelaySettings:
    return RelaySettings(
        database_url=pg_url,
        kafka_bootstrap_servers=[kafka],
        topics=[topic],
        relay_name=f"orders-{uuid.uuid4().hex[:6]}",
        sweep_interval=1.0,
        retention=timedelta(hours=1),  # keep published records, so that they can be replayed
        **SERVICE_SETTINGS,
    )


@contextlib.asynccontextmanager
async def orders_service(pg_url: str, kafka: str, topic: str) -> AsyncIterator[httpx.AsyncClient]:
    kit = Outboxkit(
        source="orders",
        relay=relay_settings(pg_url, kafka, topic),
        registry=CollectorRegistry(),
    )
    app = orders_app(kit, topic)
    async with kit.lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://orders") as client:
            yield client


async def test_an_order_takes_effect_in_payments_exactly_once(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic("orders", partitions=3)
    await create_tables(pg_url)
    payments = Outboxkit(
        source="payments",
        settings=ConnectionSettings(database_url=pg_url),
        inbox=payments_inbox(f"payments-{uuid.uuid4().hex[:6]}"),
        inbox_settings=InboxSettings(
            database_url=pg_url,
            kafka_bootstrap_servers=[kafka_bootstrap],
            topics=[topic],
            **SERVICE_SETTINGS,
        ),
        registry=CollectorRegistry(),
    )
    async with orders_service(pg_url, kafka_bootstrap, topic) as orders, payments.lifespan():
        await wait_for(
            lambda: _ready(orders), within=30, what="readiness (the relay registered its topic)"
        )
        for i in range(30):
            response = await orders.post(
                "/orders", json={"customer_id": f"c{i % 4}", "amount": "12.50"}
            )
            assert response.status_code == 200, response.text
        await wait_for(
            lambda: _equals(count(pg_url, "SELECT count(*) FROM shop_payments"), 30),
            within=60,
            what="30 payments",
        )
        health = (await orders.get("/healthz")).json()
        assert health["healthy"], health
        assert health["relay"]["owned"], "the relay owns the topic's partitions"
        assert payments.health().healthy, payments.health()

        # A replay of some events (an operator's `outboxkit outbox replay`): no second effect.
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            ids = [
                r[0]
                for r in await (
                    await conn.execute("SELECT event_id FROM shop_payments LIMIT 5")
                ).fetchall()
            ]
        async with PostgresOutboxOperations(pg_url, connect_timeout=5) as operations:
            assert await operations.replay(ids) == 5
        duplicates = payments.registry
        await wait_for(
            lambda: (
                (
                    duplicates.get_sample_value(
                        "outboxkit_inbox_duplicates_total", {"inbox": payments_name(payments)}
                    )
                    or 0
                )
                >= 5
            ),
            within=60,
            what="the replayed events absorbed",
        )
        assert await count(pg_url, "SELECT count(*) FROM shop_payments") == 30
        assert (
            await count(
                pg_url, "SELECT count(*) FROM (SELECT DISTINCT order_id FROM shop_payments) p"
            )
            == 30
        )
        assert (await orders.get("/metrics")).text.count("outboxkit_relay_published_total") >= 1

    # Shutdown drained both: the background tasks ended by themselves, without errors.
    assert payments.health().state == "closed"
    for task in payments.tasks.values():
        assert task.done()
        assert task.exception() is None


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/healthz")).status_code == 200


def payments_name(kit: Outboxkit) -> str:
    assert kit.inbox_worker is not None
    return kit.inbox_worker.inbox.name


async def _equals(value: Any, expected: int) -> bool:
    return bool(await value == expected)


async def test_a_dead_background_task_turns_health_red_and_can_stop_the_process(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic("orders", partitions=1)
    kit = Outboxkit(
        source="orders",
        relay=relay_settings(pg_url, kafka_bootstrap, topic),
        exit_on_failure=True,
        registry=CollectorRegistry(),
    )
    app = orders_app(kit, topic)
    terminated = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, terminated.set)
    try:
        async with kit.lifespan(app):
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://o")
            async with client:
                await wait_for(
                    lambda: kit.health().healthy, within=30, what="the relay to own its partition"
                )
                assert (await client.get("/livez")).status_code == 200
                kit.tasks["relay"].cancel()  # the relay task dies
                # SIGTERM asks uvicorn to stop, once the relay task has finished its cleanup.
                await asyncio.wait_for(terminated.wait(), 60)
                response = await client.get("/healthz")
                assert response.status_code == 503
                assert response.json()["failed"] == {"relay": "cancelled"}
                assert (await client.get("/livez")).status_code == 503
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _topic(kafka: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        name = f"orders-{uuid.uuid4().hex[:10]}"
        await admin.create_topics([NewTopic(name, 1, 1)])
        return name
    finally:
        await admin.close()


def test_testclient_with_a_nested_lifespan(pg_url: str, kafka_bootstrap: str) -> None:
    """The synchronous TestClient runs the lifespan in its own event loop thread."""
    topic = asyncio.run(_topic(kafka_bootstrap))
    asyncio.run(create_tables(pg_url))
    kit = Outboxkit(
        source="orders",
        relay=relay_settings(pg_url, kafka_bootstrap, topic),
        registry=CollectorRegistry(),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with kit.lifespan(app) as state:
            yield {**state, "greeting": "hello"}

    app = orders_app(kit, topic)
    app.router.lifespan_context = lifespan
    with TestClient(app) as client:
        asyncio.run(
            wait_for(lambda: client.get("/healthz").status_code == 200, within=30, what="readiness")
        )
        assert client.post("/orders", json={"customer_id": "c", "amount": "1"}).status_code == 200
        asyncio.run(
            wait_for(
                lambda: _equals(
                    count(pg_url, "SELECT count(*) FROM outboxkit.outbox WHERE state = 'pending'"),
                    0,
                ),
                within=30,
                what="the order's event published",
            )
        )
        assert client.get("/healthz").json()["healthy"]
        assert client.app_state["greeting"] == "hello"
    assert kit.health().state == "closed"
