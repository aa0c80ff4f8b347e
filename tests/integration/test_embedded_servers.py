"""The server controllers the other tests rely on: restarts keep ports and data."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.embedded import kafka as kafka_module
from outboxkit.embedded.kafka import KafkaCluster
from outboxkit.embedded.postgres import EmbeddedPostgres, StopMode
from tests.helpers import mapped_class_archives


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_keeps_committed_data_across_restart(
    pg_factory: Callable[[], EmbeddedPostgres], mode: StopMode
) -> None:
    server = pg_factory()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
        conn.execute("INSERT INTO t VALUES (1), (2)")
    port = server.port
    server.restart(mode)
    assert server.port == port
    with psycopg.connect(server.url()) as conn:
        assert conn.execute("SELECT sum(v) FROM t").fetchone() == (3,)


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    # Long enough for a killed leader's partitions to move to a surviving replica.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=30000)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


async def _consume_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while len(values) < count:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(r.value for r in records if r.value is not None)
    finally:
        await consumer.stop()
    return values


async def _create_topic(bootstrap: str, topic: str, replication: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, replication)])
    finally:
        await admin.close()


async def test_kafka_broker_restart_keeps_records(
    kafka_factory: Callable[[int], KafkaCluster],
) -> None:
    cluster = await asyncio.to_thread(kafka_factory, 1)
    await _create_topic(cluster.bootstrap_servers, "restart", 1)
    await _produce(cluster.bootstrap_servers, "restart", [b"before"])
    node = cluster.nodes[0]
    await asyncio.to_thread(node.stop)
    await asyncio.to_thread(node.start)
    await _produce(cluster.bootstrap_servers, "restart", [b"after"])
    assert await _consume_all(cluster.bootstrap_servers, "restart", 2) == [b"before", b"after"]


@pytest.mark.slow
async def test_three_node_cluster_survives_one_node_down(
    kafka_factory: Callable[[int], KafkaCluster],
) -> None:
    cluster = await asyncio.to_thread(kafka_factory, 3)
    await _create_topic(cluster.bootstrap_servers, "replicated", 3)
    await _produce(cluster.bootstrap_servers, "replicated", [b"1"])
    await asyncio.to_thread(cluster.nodes[0].kill)
    # acks=all with min.insync.replicas=2 still succeeds on the two remaining replicas.
    survivors = ",".join(n.address for n in cluster.nodes[1:])
    await _produce(survivors, "replicated", [b"2"])
    await asyncio.to_thread(cluster.nodes[0].start)
    assert await _consume_all(cluster.bootstrap_servers, "replicated", 2) == [b"1", b"2"]


def test_a_cluster_id_that_starts_with_a_dash_formats(
    kafka_factory: Callable[[int], KafkaCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's ids are URL-safe base64: 1 in 64 starts with '-', which once failed a CI run."""
    monkeypatch.setattr(kafka_module, "_kafka_uuid", lambda: "-" + "A" * 21)
    cluster = kafka_factory(1)
    assert cluster.cluster_id.startswith("-")
    assert cluster.nodes[0].running


def test_kafka_jvms_map_the_class_archive(kafka_factory: Callable[[int], KafkaCluster]) -> None:
    """A started cluster's JVMs map the archive of Kafka's classes: a JVM that cannot (another
    JDK build, another classpath) starts without it, only slower."""
    cluster = kafka_factory(1)
    [option] = cluster.jvm_options
    archive = option.removeprefix("-XX:SharedArchiveFile=")
    assert archive in mapped_class_archives(cluster.nodes[0].pid or 0)
