"""outboxkit.testing as a user adds it: a fresh project whose conftest.py says
``pytest_plugins = ["outboxkit.testing"]``, run by pytest in a subprocess (pytester), in
pytest-asyncio's default strict mode.

- in memory: a writer and a handler with no server (effects once, a duplicate absorbed, a
  failing handler rolled back), a batch handler given the run in one call, published events
  read back;
- embedded servers started by the plugin itself (PostgreSQL and, without Java, Tansu), with the
  project's own tables from ``outboxkit_schema``; an embedded MongoDB replica set;
- the Docker fixtures skip, with a reason naming Docker, where no daemon runs (here).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from outboxkit.embedded.mongodb import find_mongod

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CONFTEST = """
from pathlib import Path

import pytest

pytest_plugins = ["outboxkit.testing"]


@pytest.fixture(scope="session")
def outboxkit_schema():
    return ["CREATE TABLE charges (order_id text PRIMARY KEY, amount numeric NOT NULL)"]
"""

EVENTS = """
from decimal import Decimal

from outboxkit.schemas import Event


class OrderPlaced(Event, type="shop.order_placed", topic="orders", key_field="customer_id"):
    order_id: str
    customer_id: str
    total: Decimal
"""

MEMORY_TESTS = """
from decimal import Decimal

import pytest

from outboxkit.core.memory import MemoryTransaction
from outboxkit.inbox import Inbox
from shop_events import OrderPlaced

inbox = Inbox[MemoryTransaction]("payments")


@inbox.handler(OrderPlaced)
async def charge(event: OrderPlaced, tx: MemoryTransaction) -> None:
    if event.total > 1000:
        raise ValueError("above the card limit")
    tx.record(("charge", event.order_id, event.total))


@pytest.mark.asyncio
async def test_a_writer_in_memory(outboxkit_memory):
    await outboxkit_memory.create_topics("orders")
    placed = OrderPlaced(order_id="o-1", customer_id="c-1", total=Decimal("9.90"))
    async with outboxkit_memory.transaction() as tx:
        await outboxkit_memory.outbox.add(tx, placed)
    with pytest.raises(RuntimeError):
        async with outboxkit_memory.transaction() as tx:
            rolled_back = OrderPlaced(order_id="o-2", customer_id="c-2", total=1)
            await outboxkit_memory.outbox.add(tx, rolled_back)
            raise RuntimeError("rolled back: its event never existed")
    assert await outboxkit_memory.published(OrderPlaced) == []
    await outboxkit_memory.run_relay_until_empty()
    assert await outboxkit_memory.published(OrderPlaced) == [placed]


@pytest.mark.asyncio
async def test_a_handler_in_memory(outboxkit_memory):
    placed = OrderPlaced(order_id="o-1", customer_id="c-1", total=Decimal("9.90"))
    assert await outboxkit_memory.deliver(inbox, placed, placed) == [True, False]
    with pytest.raises(ValueError, match="card limit"):
        await outboxkit_memory.deliver(
            inbox, OrderPlaced(order_id="o-2", customer_id="c-2", total=5000)
        )


batches = Inbox[MemoryTransaction]("ledger")
calls = []


@batches.batch_handler(OrderPlaced)
async def book(events, tx: MemoryTransaction) -> None:
    calls.append([event.order_id for event in events])
    for event in events:
        tx.record(("book", event.order_id))


@pytest.mark.asyncio
async def test_a_batch_handler_in_memory(outboxkit_memory):
    orders = [OrderPlaced(order_id=f"o-{i}", customer_id="c-1", total=1) for i in range(3)]
    assert await outboxkit_memory.deliver(batches, *orders, orders[0]) == [True] * 3 + [False]
    assert calls == [["o-0", "o-1", "o-2"]]
"""

SERVER_TESTS = """
from decimal import Decimal

import psycopg
import pytest

from outboxkit.inbox import Inbox
from shop_events import OrderPlaced

inbox = Inbox("payments")


@inbox.handler(OrderPlaced)
async def charge(event, tx):
    await tx.execute("INSERT INTO charges VALUES (%s, %s)", (event.order_id, event.total))


@pytest.mark.asyncio
async def test_through_real_servers(outboxkit):
    assert not outboxkit.broker.transactions  # Tansu, as configured
    await outboxkit.create_topics("orders")
    await outboxkit.add(OrderPlaced(order_id="o-1", customer_id="c-1", total=Decimal("9.90")))
    await outboxkit.run_relay_until_empty()
    [event] = await outboxkit.published(OrderPlaced)
    assert event.order_id == "o-1"
    await outboxkit.run_inbox_until_idle(inbox)
    async with await psycopg.AsyncConnection.connect(outboxkit.database_url) as conn:
        rows = await (await conn.execute("SELECT order_id, amount FROM charges")).fetchall()
    assert rows == [("o-1", Decimal("9.90"))]
"""

MONGODB_TESTS = """
from decimal import Decimal

import pytest

from outboxkit.testing import OutboxkitHarness
from shop_events import OrderPlaced


@pytest.mark.asyncio
async def test_on_mongodb(outboxkit_mongodb_url, outboxkit_kafka):
    assert outboxkit_mongodb_url.startswith("mongodb://")
    async with OutboxkitHarness(outboxkit_mongodb_url, outboxkit_kafka) as harness:
        await harness.create_topics("orders")
        await harness.add(OrderPlaced(order_id="o-1", customer_id="c-1", total=Decimal("1")))
        await harness.run_relay_until_empty()
        [event] = await harness.published(OrderPlaced)
    assert event.order_id == "o-1"
"""

DOCKER_TESTS = """
def test_postgres_in_docker(outboxkit_postgres_container):
    pass


def test_kafka_in_docker(outboxkit_kafka_container):
    pass


def test_mongodb_in_docker(outboxkit_mongodb_container):
    pass
"""

CLUSTER_TESTS = """
import pytest

from outboxkit.embedded.kafka_topology import KafkaTopology


@pytest.mark.asyncio
async def test_a_kafka_cluster_whose_leader_moves(outboxkit_kafka_cluster):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    cluster = outboxkit_kafka_cluster
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    await admin.start()
    await admin.create_topics([NewTopic("orders", 1, 3)])
    await admin.close()
    async with KafkaTopology(cluster.bootstrap_servers) as topology:
        leader = await topology.partition_leader("orders", 0)
        cluster.node(leader).kill()
        moved = await topology.partition_leader("orders", 0, other_than=leader)
        assert moved != leader


def test_a_replica_set_that_fails_over(outboxkit_mongodb_replica_set):
    replica_set = outboxkit_mongodb_replica_set
    first = replica_set.primary()
    first.kill()
    assert replica_set.primary() is not first
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(shop_events=EVENTS)
    pytester.makeini(
        "[pytest]\noutboxkit_broker = tansu\npythonpath = .\n"
        "asyncio_default_fixture_loop_scope = function\n"
    )
    return pytester


def test_in_memory_without_servers(project: pytest.Pytester) -> None:
    project.makepyfile(test_memory=MEMORY_TESTS)
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_embedded_servers_started_by_the_plugin(project: pytest.Pytester) -> None:
    project.makepyfile(test_servers=SERVER_TESTS)
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=1)


def test_embedded_mongodb_started_by_the_plugin(project: pytest.Pytester) -> None:
    project.makepyfile(test_mongodb=MONGODB_TESTS)
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=1)


@pytest.mark.mongodb
def test_the_cluster_fixtures_fail_over(
    project: pytest.Pytester, kafka_jars: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opt-in failover fixtures: a 3-node Kafka whose partition leader moves when its node
    is killed, and a 3-member replica set that elects another primary."""
    # pytester gives the run a home of its own: point it at the cached jars and mongod.
    monkeypatch.setenv("OUTBOXKIT_KAFKA_JARS", str(kafka_jars))
    monkeypatch.setenv("OUTBOXKIT_MONGOD", str(find_mongod(fetch=True)))
    project.makepyfile(test_clusters=CLUSTER_TESTS)
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=2)


def test_the_docker_fixtures_skip_naming_docker(project: pytest.Pytester) -> None:
    project.makepyfile(test_docker=DOCKER_TESTS)
    result = project.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    assert "Docker" in result.stdout.str()
