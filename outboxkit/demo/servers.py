"""The servers the demo runs on: a database (the embedded PostgreSQL, the embedded mongod, or the
MongoDB replica set at ``OUTBOXKIT_DATABASE_URL``) and a broker (Tansu or Apache Kafka).

Each is started in the calling thread — a server dies with the thread that started it
(``PR_SET_PDEATHSIG``) — and stopped by the ``ExitStack`` it is registered with.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import SplitResult, parse_qsl, quote, urlsplit, urlunsplit

from pymongo import MongoClient
from pymongo.errors import PyMongoError
from rich.console import Console

from outboxkit import ConfigurationError
from outboxkit.embedded import EmbeddedMongo, EmbeddedPostgres, EmbeddedTansu, KafkaCluster
from outboxkit.embedded.kafka import kafka_jars_dir
from outboxkit.embedded.mongodb import MONGOD_VERSION, mongod_cache_dir
from outboxkit.embedded.postgres import FAST_TEST_SETTINGS

Broker = Literal["tansu", "kafka"]
Database = Literal["postgresql", "mongodb"]


def mongod_note() -> str:
    """What ``--database mongodb`` tells before it runs the embedded mongod (its licence is in
    ``--help`` and docs/demo.md too): which binary runs, and that it is fetched only when it
    is about to be."""
    what = (
        f"mongod {MONGOD_VERSION} is MongoDB Community Server, licensed under the SSPL (not part "
        "of outboxkit)"
    )
    configured = os.environ.get("OUTBOXKIT_MONGOD")
    if configured:
        return f"{what}: running OUTBOXKIT_MONGOD={configured}"
    cached = mongod_cache_dir() / "mongod"
    if cached.is_file():
        return f"{what}: running {cached}"
    return f"{what}: fetching it into {cached.parent} (42 MB, first use only) …"


@dataclass
class DemoDatabase:
    """The database the demo placed its orders in."""

    kind: Database
    #: The demo's database on it (for outboxkit's collections or schema and the shop's).
    url: str
    #: "PostgreSQL on 127.0.0.1:5432" (what the demo prints).
    where: str
    pids: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return DATABASE_NAMES[self.kind]


DATABASE_NAMES: dict[Database, str] = {"postgresql": "PostgreSQL", "mongodb": "MongoDB"}


def start_database(
    kind: Database, workdir: Path, stack: contextlib.ExitStack, console: Console
) -> DemoDatabase:
    if kind == "postgresql":
        pg = EmbeddedPostgres(workdir / "postgres", settings=FAST_TEST_SETTINGS)
        stack.callback(pg.close)
        pg.start()
        return DemoDatabase(kind, pg.url(), f"PostgreSQL on 127.0.0.1:{pg.port}", _pids(pg.pid))
    external = os.environ.get("OUTBOXKIT_DATABASE_URL", "")
    if _is_mongodb(external):
        return _external_mongodb(external, stack)
    console.print(f"[dim]{mongod_note()}[/]")
    mongo = EmbeddedMongo(workdir / "mongo", fetch=True)
    stack.callback(mongo.close)
    mongo.start()
    return DemoDatabase(
        kind, mongo.url("demo"), f"MongoDB (embedded mongod) on {mongo.address}", _pids(mongo.pid)
    )


def _is_mongodb(url: str) -> bool:
    return url.startswith(("mongodb://", "mongodb+srv://"))


def _external_mongodb(server_url: str, stack: contextlib.ExitStack) -> DemoDatabase:
    """A new database ``outboxkit_demo_<hex>`` on the replica set at ``server_url``, dropped at
    the end: the demo never touches the database the URL names."""
    name = f"outboxkit_demo_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(server_url)
    url = urlunsplit(parts._replace(path=f"/{name}", query=_keep_auth_source(parts)))
    client: MongoClient[dict[str, Any]] = MongoClient(url, serverSelectionTimeoutMS=10_000)
    stack.callback(client.close)
    try:
        hello = client.admin.command("hello")
    except PyMongoError as exc:
        raise ConfigurationError(
            f"--database mongodb: cannot reach OUTBOXKIT_DATABASE_URL ({parts.hostname}): {exc}"
        ) from None
    if "setName" not in hello:
        raise ConfigurationError(
            "--database mongodb: the server at OUTBOXKIT_DATABASE_URL is not part of a replica "
            "set; change streams and transactions need one (docs/mongodb.md), or unset "
            "OUTBOXKIT_DATABASE_URL to run the embedded mongod"
        )
    stack.callback(client.drop_database, name)
    where = f"MongoDB replica set {hello['setName']} at {parts.hostname}, database {name}"
    return DemoDatabase("mongodb", url, f"{where} (dropped at the end)")


def _keep_auth_source(parts: SplitResult) -> str:
    """The URL's query, with the database that authenticated its user made explicit: without
    ``authSource``, MongoDB authenticates against the URL's database, which the demo replaces."""
    options = {key.lower() for key, _ in parse_qsl(parts.query)}
    if parts.username is None or "authsource" in options:
        return parts.query
    source = f"authSource={quote(parts.path.lstrip('/') or 'admin')}"
    return f"{parts.query}&{source}" if parts.query else source


def _pids(*pids: int | None) -> list[int]:
    return [pid for pid in pids if pid is not None]


# -- the broker --------------------------------------------------------------------------------


class BrokerServer(Protocol):
    @property
    def bootstrap_servers(self) -> str: ...

    def start(self) -> Any: ...

    def close(self) -> None: ...


def make_broker(broker: Broker, workdir: Path) -> BrokerServer:
    if broker == "tansu":
        return EmbeddedTansu(workdir / "tansu")
    if shutil.which("java") is None:
        raise ConfigurationError(
            "--broker kafka runs Apache Kafka from its jars and needs Java 17 "
            "(apt-get install openjdk-17-jre-headless); the default broker needs nothing"
        )
    try:
        jars = kafka_jars_dir()
    except ConfigurationError as exc:
        raise ConfigurationError(f"--broker kafka: {exc}") from None
    # The demo's run is short: HotSpot's C1 and the serial GC start the broker sooner, on less
    # CPU (KafkaCluster's quick_jvm), and its few thousand records never need C2's code.
    return KafkaCluster(1, jars_dir=jars, base_dir=workdir / "kafka", quick_jvm=True)


def broker_name(broker: Broker) -> str:
    return "Tansu (embedded)" if broker == "tansu" else "Apache Kafka (embedded)"


def broker_pids(broker: BrokerServer) -> list[int]:
    if isinstance(broker, KafkaCluster):
        return _pids(*(node.pid for node in broker.nodes))
    if isinstance(broker, EmbeddedTansu):
        return _pids(broker.pid)
    return []
