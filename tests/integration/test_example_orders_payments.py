"""The example services against real Apache Kafka and a real database — examples/orders_payments
on PostgreSQL, examples/orders_payments_mongodb on MongoDB: an order placed over HTTP is paid by
the payments service exactly once, and the payment comes back to the orders service — outbox →
relay → inbox → handler → outbox → relay → inbox."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from types import ModuleType

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from examples.orders_payments import orders, payments
from examples.orders_payments_mongodb import orders as mongodb_orders
from examples.orders_payments_mongodb import payments as mongodb_payments
from tests.docs_snippets import REPO
from tests.helpers import wait_for
from tests.integration.conftest import MakeTopic
from tests.timeouts import GROUP_ENV, SWEEP_INTERVAL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: The two services and the fixture of their database, for each database.
EXAMPLES = {
    "postgresql": (orders, payments, "pg_url"),
    "mongodb": (mongodb_orders, mongodb_payments, "mongo_url"),
}


@contextlib.asynccontextmanager
async def serve(app: FastAPI, name: str) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{name}") as client:
            await wait_for(lambda: _ready(client), within=60, what=f"{name} ready")
            yield client


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/healthz")).status_code == 200


@pytest.fixture(
    params=[pytest.param("postgresql"), pytest.param("mongodb", marks=pytest.mark.mongodb)]
)
def example(request: pytest.FixtureRequest) -> tuple[ModuleType, ModuleType, str]:
    """Each database in turn: its orders and payments services, and a fresh database's URL."""
    orders_service, payments_service, url_fixture = EXAMPLES[request.param]
    return orders_service, payments_service, request.getfixturevalue(url_fixture)


async def test_an_order_is_paid_once_and_the_orders_service_learns_it(
    example: tuple[ModuleType, ModuleType, str],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orders_service, payments_service, database_url = example
    for topic in ("shop.orders", "shop.payments"):
        await make_topic(name=topic, partitions=3)
        await make_topic(name=f"{topic}.dlq")
    for name, value in {
        "OUTBOXKIT_DATABASE_URL": database_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        **GROUP_ENV,
        "OUTBOXKIT_SWEEP_INTERVAL": f"{SWEEP_INTERVAL:g}",
    }.items():
        monkeypatch.setenv(name, value)
    registries = {"orders": CollectorRegistry(), "payments": CollectorRegistry()}
    orders_app = orders_service.create_app(registries["orders"])
    payments_app = payments_service.create_app(registries["payments"])
    async with serve(orders_app, "orders") as shop, serve(payments_app, "payments") as bank:
        placed = []
        for i in range(12):
            response = await shop.post(
                "/orders",
                json={
                    "customer_id": f"c{i % 3}",
                    "lines": [{"sku": "tea", "quantity": 2, "unit_price": "3.25"}],
                },
            )
            assert response.status_code == 201, response.text
            placed.append(response.json())
        assert placed[0]["amount"] == "6.50"

        async def all_paid() -> bool:
            for order in placed:
                found = (await shop.get(f"/orders/{order['order_id']}")).json()
                if found["status"] != "paid":
                    return False
            return True

        await wait_for(all_paid, within=60, what="every order paid")
        for order in placed:
            payment = (await bank.get(f"/payments/{order['order_id']}")).json()
            assert payment["amount"] == "6.50"
        assert (await shop.get("/orders/o-nope")).status_code == 404
        # The console the services mount: the orders relay's partitions, the inbox's lag.
        console = await shop.get("/outboxkit/")
        assert console.status_code == 200, console.text
        assert 'data-partition="shop.orders/2"' in console.text
        assert "Inbox <code>orders</code>" in console.text
        assert "This service's relay" in console.text  # its own health, degraded modes too
        assert "frame-ancestors 'none'" in console.headers["content-security-policy"]
    # Each order was paid once (one payment each), and each payment marked one order paid.
    for inbox, registry in registries.items():
        handled = registry.get_sample_value("outboxkit_inbox_handled_total", {"inbox": inbox})
        assert handled == len(placed), inbox
        dead = registry.get_sample_value("outboxkit_inbox_dead_lettered_total", {"inbox": inbox})
        assert not dead, inbox


EXAMPLE_TESTS = "examples/orders_payments"


async def test_the_example_services_own_tests_pass_with_the_testing_plugin(
    pg_server_url: str, kafka_bootstrap: str
) -> None:
    """examples/orders_payments/tests use outboxkit.testing as a service's tests would; they
    run as their own pytest session, on this session's servers (OUTBOXKIT_TEST_PG_URL/KAFKA)."""
    result = await asyncio.to_thread(
        subprocess.run,
        # One process, as a service's own suite runs: this repository's pyproject.toml would
        # spread the example's tests, which share fixed topic names, over parallel workers.
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n0", EXAMPLE_TESTS],
        cwd=REPO,
        env={
            **os.environ,
            "OUTBOXKIT_TEST_PG_URL": pg_server_url,
            "OUTBOXKIT_TEST_KAFKA": kafka_bootstrap,
        },
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 passed" in result.stdout
