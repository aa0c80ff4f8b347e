"""A pytest plugin for your service's tests: real servers, or everything in memory.

Enable it in your ``conftest.py`` (the ``[testing]`` extra)::

    pytest_plugins = ["outboxkit.testing"]

It is opt-in on purpose (no ``pytest11`` entry point): installing outboxkit changes no other
project's test run, and its fixtures, servers and imports appear only where asked for.

Fixtures (docs/testing.md):

========================== ======== ===========================================================
``outboxkit_memory``       test     an :class:`OutboxkitHarness` on ``memory://``: writers and
                                    handlers without any server
``outboxkit``              test     an :class:`OutboxkitHarness` on a fresh migrated database of
                                    ``outboxkit_postgres`` and the ``outboxkit_kafka`` broker
``outboxkit_database_url`` test     that fresh database (outboxkit's tables, and yours from
                                    ``outboxkit_schema``), cloned from a template in ~20 ms
``outboxkit_postgres``     session  a PostgreSQL server's admin URL: embedded (the wheel),
                                    ``OUTBOXKIT_TEST_PG_URL``, or a container
``outboxkit_kafka``        session  a :class:`Broker`: embedded Apache Kafka (Java 17) or Tansu,
                                    ``OUTBOXKIT_TEST_KAFKA``, or a container
``outboxkit_mongodb``      session  a MongoDB replica set's URL: embedded mongod,
                                    ``OUTBOXKIT_TEST_MONGO_URL``, or a container
``outboxkit_mongodb_url``  test     a fresh migrated MongoDB database, dropped afterwards
``outboxkit_schema``       session  override it: your tables (SQL text or ``.sql`` paths)
``outboxkit_*_container``  session  PostgreSQL, Kafka, MongoDB in Docker (``[testcontainers]``);
                                    skipped, with the reason, where Docker is not available
``outboxkit_kafka_cluster`` test    three Apache Kafka nodes (RF 3, ``min.insync.replicas=2``)
                                    whose nodes the test may kill and restart; with
                                    :class:`~outboxkit.embedded.kafka_topology.KafkaTopology`
``outboxkit_mongodb_replica_set``   three mongod as one replica set (test scope) whose primary
                                    the test may step down, stop or kill, with short elections
========================== ======== ===========================================================

The two cluster fixtures are heavier (several servers each, 10-30 s to start) and are started
only for a test that asks for one: for failover tests of a service (docs/testing.md).

pytest configuration (``[tool.pytest.ini_options]``): ``outboxkit_broker = kafka | tansu``
(the embedded broker), ``outboxkit_servers = embedded | docker`` (what ``outboxkit_postgres``
and ``outboxkit_kafka`` start).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

try:
    import pytest
    import pytest_asyncio
except ModuleNotFoundError as missing:  # its submodules too (outboxkit.testing.schemas) need it
    raise ModuleNotFoundError(
        f"outboxkit.testing needs the [testing] extra ({missing.name} is not installed): "
        "pip install 'outboxkit[testing]'",
        name=missing.name,
    ) from None

from outboxkit.backends import backend_for, forget_memory_database
from outboxkit.embedded import KafkaCluster
from outboxkit.embedded.mongodb import EmbeddedMongoReplicaSet
from outboxkit.testing.harness import Broker, OutboxkitHarness
from outboxkit.testing.schemas import assert_compatible
from outboxkit.testing.servers import (
    docker_unavailable,
    embedded_broker,
    embedded_mongodb,
    embedded_postgres,
    kafka_container,
    mongodb_container,
    postgres_container,
)

__all__ = [
    "Broker",
    "OutboxkitHarness",
    "assert_compatible",
    "outboxkit",
    "outboxkit_database_url",
    "outboxkit_kafka",
    "outboxkit_kafka_cluster",
    "outboxkit_kafka_container",
    "outboxkit_memory",
    "outboxkit_mongodb",
    "outboxkit_mongodb_container",
    "outboxkit_mongodb_replica_set",
    "outboxkit_mongodb_url",
    "outboxkit_postgres",
    "outboxkit_postgres_container",
    "outboxkit_schema",
    "outboxkit_template",
    "pytest_addoption",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "outboxkit_broker",
        "the embedded broker of the outboxkit fixtures: kafka (Java 17) or tansu (no Java)",
        default="kafka",
    )
    parser.addini(
        "outboxkit_servers",
        "where outboxkit_postgres and outboxkit_kafka come from: embedded or docker",
        default="embedded",
    )


def _servers(config: pytest.Config) -> str:
    value = str(config.getini("outboxkit_servers")).strip()
    if value not in ("embedded", "docker"):
        raise pytest.UsageError(f"outboxkit_servers = {value!r}: use embedded or docker")
    return value


# -- servers -----------------------------------------------------------------------------------


T = TypeVar("T")


def _session_server(
    request: pytest.FixtureRequest,
    variable: str,
    container: str,
    embedded: Callable[[], AbstractContextManager[T]],
    external: Callable[[str], T],
) -> Iterator[T]:
    """The server ``variable`` points at, else the ``container`` fixture's (docker), else an
    embedded one."""
    given = os.environ.get(variable)
    if given:
        yield external(given)
    elif _servers(request.config) == "docker":
        yield request.getfixturevalue(container)
    else:
        with embedded() as server:
            yield server


@pytest.fixture(scope="session")
def outboxkit_postgres(request: pytest.FixtureRequest) -> Iterator[str]:
    """Admin URL of a PostgreSQL server for the whole session."""
    yield from _session_server(
        request, "OUTBOXKIT_TEST_PG_URL", "outboxkit_postgres_container", embedded_postgres, str
    )


@pytest.fixture(scope="session")
def outboxkit_kafka(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A Kafka-protocol broker for the whole session."""
    kind = str(request.config.getini("outboxkit_broker")).strip()
    yield from _session_server(
        request,
        "OUTBOXKIT_TEST_KAFKA",
        "outboxkit_kafka_container",
        lambda: embedded_broker(kind),
        Broker,
    )


@pytest.fixture(scope="session")
def outboxkit_mongodb(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL (without a database) of a MongoDB replica set for the whole session."""
    yield from _session_server(
        request, "OUTBOXKIT_TEST_MONGO_URL", "outboxkit_mongodb_container", embedded_mongodb, str
    )


def _need_docker() -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def outboxkit_postgres_container() -> Iterator[str]:
    """PostgreSQL in Docker (admin URL); skipped where Docker is not available."""
    _need_docker()
    with postgres_container() as url:
        yield url


@pytest.fixture(scope="session")
def outboxkit_kafka_container() -> Iterator[Broker]:
    """Apache Kafka in Docker; skipped where Docker is not available."""
    _need_docker()
    with kafka_container() as broker:
        yield broker


@pytest.fixture(scope="session")
def outboxkit_mongodb_container() -> Iterator[str]:
    """A single-node MongoDB replica set in Docker (URL); skipped where Docker is not
    available."""
    _need_docker()
    with mongodb_container() as url:
        yield url


# -- replicated clusters, for failover tests (heavier: started only where asked for) -----------


@pytest.fixture
def outboxkit_kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three KRaft nodes (replication factor 3, ``min.insync.replicas=2``, the transaction and
    offsets topics replicated three times) for one test, which may ``kill()``, ``stop()`` and
    ``start()`` its ``nodes``; ``KafkaTopology(cluster.bootstrap_servers)`` finds the node that
    leads a partition or coordinates a transactional id or a group."""
    with KafkaCluster(3, base_dir=tmp_path / "kafka-cluster", quick_jvm=True) as cluster:
        yield cluster


@pytest.fixture
def outboxkit_mongodb_replica_set(tmp_path: Path) -> Iterator[EmbeddedMongoReplicaSet]:
    """Three mongod as one replica set for one test (priorities 3, 2, 1: member 0 is the primary
    at the start; after a failover another member is, and the highest-priority one that caught
    up takes over in time), with a 2 s election timeout so that a failover takes seconds; the
    test may ``step_down()``, or ``kill()``/``stop()``/``start()`` members; ``primary()``
    says which is primary now."""
    replica_set = EmbeddedMongoReplicaSet(
        tmp_path / "mongodb-replica-set",
        fetch=True,
        election_timeout_ms=2000,
        heartbeat_interval_ms=500,
        parameters={"shutdownTimeoutMillisForSignaledShutdown": "1000"},
    )
    with replica_set:
        yield replica_set


# -- databases ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def outboxkit_schema() -> Sequence[str | Path]:
    """Your service's tables, applied to the template after outboxkit's migrations: override
    this fixture in your conftest.py with SQL texts or paths of ``.sql`` files."""
    return ()


def _with_dbname(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def outboxkit_template(
    outboxkit_postgres: str, outboxkit_schema: Sequence[str | Path]
) -> Iterator[str]:
    """A database with outboxkit's migrations and :func:`outboxkit_schema` applied, which
    every test's database is cloned from."""
    import asyncio  # noqa: PLC0415

    import psycopg  # noqa: PLC0415 - PostgreSQL's fixtures only: a MongoDB suite never loads it

    name = f"outboxkit_template_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(outboxkit_postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _with_dbname(outboxkit_postgres, name)
    asyncio.run(backend_for(url).migrate(10.0))
    with psycopg.connect(url, autocommit=True) as conn:
        for item in outboxkit_schema:
            conn.execute(item.read_text() if isinstance(item, Path) else item)
    yield name
    with psycopg.connect(outboxkit_postgres, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def outboxkit_database_url(outboxkit_postgres: str, outboxkit_template: str) -> Iterator[str]:
    """A fresh database for this test: outboxkit's tables and yours, nothing in them."""
    import psycopg  # noqa: PLC0415 - as above

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(outboxkit_postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{outboxkit_template}"')
    yield _with_dbname(outboxkit_postgres, name)
    with psycopg.connect(outboxkit_postgres, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def outboxkit_mongodb_url(outboxkit_mongodb: str) -> Iterator[str]:
    """A fresh MongoDB database with outboxkit's collections for this test, dropped afterwards:
    ``OutboxkitHarness(outboxkit_mongodb_url, outboxkit_kafka)`` works on it."""
    import asyncio  # noqa: PLC0415

    from pymongo import MongoClient  # noqa: PLC0415

    url = _with_dbname(outboxkit_mongodb, f"test_{uuid.uuid4().hex[:12]}")
    asyncio.run(backend_for(url).migrate(10.0))
    yield url
    client: MongoClient[dict[str, object]] = MongoClient(outboxkit_mongodb)
    try:
        client.drop_database(urlsplit(url).path.lstrip("/"))
    finally:
        client.close()


# -- harnesses ---------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def outboxkit(
    outboxkit_database_url: str, outboxkit_kafka: Broker
) -> AsyncIterator[OutboxkitHarness]:
    """Helpers over this test's database and the session's broker (:class:`OutboxkitHarness`)."""
    async with OutboxkitHarness(outboxkit_database_url, outboxkit_kafka) as harness:
        yield harness


@pytest_asyncio.fixture
async def outboxkit_memory() -> AsyncIterator[OutboxkitHarness]:
    """The same helpers on a ``memory://`` database of this test alone, with no server: writers
    and handlers written against the in-memory transaction, published events read back."""
    url = f"memory://test-{uuid.uuid4().hex[:12]}"
    try:
        async with OutboxkitHarness(url) as harness:
            yield harness
    finally:
        forget_memory_database(url)
