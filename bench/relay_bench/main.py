"""The relay benchmark's command line: which phases, which servers, every size and knob."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient
from pymongo import MongoClient

from bench.relay_bench.churn_faults import FAULTS
from bench.relay_bench.consumer import consumer_child
from bench.relay_bench.harness import CpuMeter, Ctx, Result, print_table, say
from bench.relay_bench.outbox import BenchOutbox, PostgresBenchOutbox
from bench.relay_bench.outbox_mongodb import MongoBenchOutbox
from bench.relay_bench.phase_ceiling import phase_ceiling
from bench.relay_bench.phase_churn import WRITERS as CHURN_WRITERS
from bench.relay_bench.phase_churn import phase_churn
from bench.relay_bench.phase_claims import phase_claims
from bench.relay_bench.phase_drain import phase_drain
from bench.relay_bench.phase_idle import phase_idle
from bench.relay_bench.phase_steady import phase_steady
from bench.relay_bench.phase_writer import phase_writer
from bench.relay_bench.phase_writer_mongodb import phase_writer_mongodb
from bench.relay_bench.relays import child_relay
from bench.relay_bench.security import (
    SECURITIES,
    KafkaSecurity,
    Plaintext,
    SaslSsl,
    compare_security,
    warm_up,
)
from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.embedded.kafka_security import SecuredKafkaCluster
from outboxkit.embedded.mongodb import EmbeddedMongo

PHASES: dict[str, Callable[[Ctx], Awaitable[None]]] = {
    "ceiling": phase_ceiling,
    "drain": phase_drain,
    "steady": phase_steady,
    "idle": phase_idle,
    "churn": phase_churn,
    "writer": phase_writer,
    "claims": phase_claims,
}
#: Phases that need no outbox database.
_KAFKA_ONLY = {"ceiling"}
#: Phases that measure PostgreSQL itself (pgbench, WAL): nothing to run on another database.
_POSTGRES_ONLY = {"claims"}
#: A phase's own variant for a database (the writer phase: pgbench on PostgreSQL).
_BY_DATABASE: dict[tuple[str, str], Callable[[Ctx], Awaitable[None]]] = {
    ("writer", "mongodb"): phase_writer_mongodb,
}
DATABASES = ("postgresql", "mongodb")

#: The embedded mongod's settings for the bench: the drain's backlog becomes visible in one
#: transaction, as on PostgreSQL, which does not fit the 0.25 GB WiredTiger cache of a throwaway
#: server ("transaction is too large and will not fit in the storage engine cache" at ~5K
#: documents): 1 GB, and a transaction may fill the whole dirty-cache budget.
MONGO_PARAMETERS = {"transactionTooLargeForCacheThreshold": "1.0"}
MONGO_RUNTIME = {"wiredTigerEngineRuntimeConfig": "cache_size=1G"}

#: PostgreSQL as production runs it (these are also the defaults): every commit is on disk.
PG_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "256MB",
    "max_wal_size": "2GB",
    # Diagnostics only: the plan of any statement slower than 1 s goes to the server log.
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "1s",
    # Each log line names its session's application: the relay's pool is "outboxkit-relay".
    "log_line_prefix": "%m [%p] %a: ",
}


def _names(text: str) -> list[str]:
    """``"a, b,"`` → ``["a", "b"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark the outboxkit relay (see bench/README.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--only", default=",".join(PHASES), help="comma-separated phases to run")
    p.add_argument("--list", action="store_true", help="list the phases and exit")
    p.add_argument(
        "--database",
        default="postgresql",
        help="the outbox's database: postgresql, mongodb, or both (mongodb,postgresql: each "
        "phase runs on one then the other; the MongoDB/PostgreSQL ratios of the drain rate and "
        "the steady and idle p50 are printed)",
    )
    p.add_argument("--postgres", help="use this PostgreSQL (superuser URL) instead of starting one")
    p.add_argument(
        "--mongodb",
        help="use this MongoDB replica set (mongodb://host:port/?replicaSet=…) instead of "
        "starting one (the bench uses its database outboxkit_bench)",
    )
    p.add_argument("--kafka", help="use this Kafka (bootstrap servers) instead of starting one")
    p.add_argument(
        "--kafka-security",
        default="plaintext",
        help="how the relays reach Kafka: plaintext, sasl_ssl, or both (plaintext,sasl_ssl: "
        "one secured broker, every phase runs over one listener then the other, in this order, "
        "and SASL_SSL/PLAINTEXT ratios are printed); sasl_ssl starts the embedded "
        "SecuredKafkaCluster (not with --kafka)",
    )
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--keys", type=int, default=1000, help="distinct event keys")
    p.add_argument("--ceiling-records", type=int, default=60_000)
    p.add_argument("--ceiling-window", type=int, default=1000, help="sends per gather")
    p.add_argument("--txn-batch", type=int, default=500, help="records per Kafka transaction")
    p.add_argument("--rows", type=int, default=100_000, help="drain backlog")
    p.add_argument("--relays", default="1,3", help="relay counts for the drain phase")
    p.add_argument("--drain-repeat", type=int, default=1, help="runs of each drain case")
    p.add_argument(
        "--stall-report",
        type=float,
        default=5.0,
        help="drain: report a partition that has not moved for this many seconds",
    )
    p.add_argument(
        "--relay-mode",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="relays as `python -m outboxkit relay` processes or as Relay objects in here",
    )
    p.add_argument(
        "--relay-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a RelaySettings field for every relay, e.g. batch_interval=0.01 (repeatable)",
    )
    p.add_argument("--drain-timeout", type=float, default=180)
    p.add_argument("--rate", type=float, default=500, help="steady: events/s")
    p.add_argument("--latency-seconds", type=float, default=15)
    p.add_argument("--latency-writers", type=int, default=16, help="writer connections")
    p.add_argument("--idle-events", type=int, default=20)
    p.add_argument("--idle-gap", type=float, default=0.3, help="idle seconds before each event")
    p.add_argument(
        "--churn-modes",
        default="dynamic,kafka-only,static,faults",
        type=_names,
        help="membership cases, and faults: random kills with other faults (churn_faults.py)",
    )
    p.add_argument(
        "--churn-faults",
        default=",".join(FAULTS),
        type=_names,
        help=f"the faults of the churn's faults case, some of {','.join(FAULTS)}",
    )
    p.add_argument("--churn-rate", type=float, default=300, help="churn: events/s")
    p.add_argument("--churn-seconds", type=float, default=60)
    p.add_argument("--churn-every", type=float, default=3.0, help="seconds between kills")
    p.add_argument("--churn-session-timeout", type=float, default=10.0)
    _writer_args(p)
    p.add_argument("--claim-rows", type=int, default=100_000)
    p.add_argument("--claim-batch", type=int, default=500)
    p.add_argument("--claim-publish-ms", type=float, default=1.0, help="fake publish per batch")
    p.add_argument(
        "--claim-checkpoint",
        action="store_true",
        help="CHECKPOINT right before each claim run, so its WAL includes a full-page image of "
        "every page it touches (default: before the fill, so the WAL holds no FPIs)",
    )
    p.add_argument(
        "--profile-dir", type=Path, help="run subprocess relays under cProfile (CPU time)"
    )
    p.add_argument("--child-consumer", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.relays = [int(x) for x in str(args.relays).split(",") if x]
    args.phases = [x.strip() for x in str(args.only).split(",") if x.strip()]
    _check_servers(p, args)
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        p.error(f"unknown phase(s) {', '.join(sorted(unknown))}; known: {', '.join(PHASES)}")
    _check_keys(p, args)
    if set(args.churn_faults) - set(FAULTS):
        p.error(f"--churn-faults: some of {', '.join(FAULTS)}")
    return args


def _writer_args(p: argparse.ArgumentParser) -> None:
    """The writer phase's: pgbench's on PostgreSQL, asyncio writer tasks' on MongoDB."""
    p.add_argument("--pgbench-clients", type=int, default=8)
    p.add_argument("--pgbench-seconds", type=int, default=20)
    p.add_argument("--pgbench-rounds", type=int, default=3)
    p.add_argument("--mongo-writers", type=int, default=8)
    p.add_argument("--mongo-writer-seconds", type=float, default=5.0)
    p.add_argument("--mongo-writer-rounds", type=int, default=6)
    p.add_argument(
        "--mongo-backlog",
        type=int,
        default=20_000,
        help="writer (MongoDB): events of the backlog written plain, with add, with add_many",
    )


def _check_servers(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--database`` and ``--kafka-security`` as lists, in the order given (the order they
    run in)."""
    args.databases = [x.strip() for x in str(args.database).split(",") if x.strip()]
    if not args.databases or set(args.databases) - set(DATABASES):
        p.error(f"--database: one or more of {', '.join(DATABASES)}")
    args.securities = list(
        dict.fromkeys(x.strip() for x in str(args.kafka_security).split(",") if x.strip())
    )
    if not args.securities or set(args.securities) - set(SECURITIES):
        p.error(f"--kafka-security: one or more of {', '.join(SECURITIES)}")
    if "sasl_ssl" in args.securities and args.kafka:
        p.error("--kafka-security sasl_ssl starts its own secured broker: not with --kafka")


def _check_keys(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each writer owns its keys, so that a key's sequence numbers follow its commit order
    (``consumer.paced_writes``): a key or more per writer."""
    writers = {"steady": args.latency_writers, "churn": CHURN_WRITERS}
    most = max((n for phase, n in writers.items() if phase in args.phases), default=0)
    if args.keys < most:
        p.error(f"--keys: at least {most}, one or more per writer (each writer owns its keys)")


async def run_phases(
    args: argparse.Namespace,
    outboxes: dict[str, BenchOutbox],
    bootstrap: str,
    securities: Sequence[KafkaSecurity],
    *,
    cpu: CpuMeter,
    workdir: Path,
    kafka_cluster: KafkaCluster | None = None,
    database_servers: Mapping[str, EmbeddedPostgres | EmbeddedMongo] | None = None,
) -> Ctx:
    """Every phase asked for, each on every database and over every ``--kafka-security`` in
    turn (the ceiling once per protocol: it is Kafka's). Returns the first context; every
    context shares its results."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    run_id = uuid.uuid4().hex[:6]
    ctxs: list[Ctx] = []
    results: list[Result] = []
    order_failures: list[str] = []
    for db, security in itertools.product(outboxes, securities):
        each = Ctx(
            args,
            outboxes[db],
            bootstrap,
            admin,
            workdir,
            cpu,
            security,
            database=db,
            results=results,
            order_failures=order_failures,
            kafka_cluster=kafka_cluster,
            database_server=(database_servers or {}).get(db),
            labelled=len(outboxes) > 1,
            # Over SASL_SSL alone, the rows say so too.
            security_labelled=[s.name for s in securities] != ["plaintext"],
        )
        suffix = f"-{security.name[:2]}" if each.security_labelled else ""
        each.run_id = f"{run_id}-{db[:2]}{suffix}"
        ctxs.append(each)
    try:
        for db, outbox in outboxes.items():
            if set(args.phases) - _KAFKA_ONLY - _POSTGRES_ONLY or (
                db == "postgresql" and set(args.phases) & _POSTGRES_ONLY
            ):
                await outbox.prepare()
        first_db = ctxs[0].database
        if len(securities) > 1:
            await warm_up([c for c in ctxs if c.database == first_db])
        for phase, run in PHASES.items():
            if phase not in args.phases:
                continue
            kafka_only = phase in _KAFKA_ONLY
            for each in [c for c in ctxs if c.database == first_db] if kafka_only else ctxs:
                await _run_phase(each, phase, run)
                for other in ctxs:
                    if other.security is each.security:
                        other.ceiling_plain = other.ceiling_plain or each.ceiling_plain
                        other.ceiling_txn = other.ceiling_txn or each.ceiling_txn
            compare_security(ctxs, phase, kafka_only=kafka_only)
        compare_databases(ctxs)
    finally:
        await admin.close()
        for outbox in outboxes.values():
            await outbox.close()
    return ctxs[0]


async def _run_phase(ctx: Ctx, phase: str, run: Callable[[Ctx], Awaitable[None]]) -> None:
    labels = [] if phase in _KAFKA_ONLY else [ctx.database]
    labels += [ctx.security.label] if ctx.security_labelled else []
    where = f" ({', '.join(labels)})" if labels else ""
    say(f"\n== {phase}{where} ==")
    if phase in _POSTGRES_ONLY and ctx.database != "postgresql":
        say(f"n/a on {ctx.database}: this phase measures PostgreSQL itself")
        ctx.add(Result(phase, f"n/a on {ctx.database}", "-", note="measures PostgreSQL itself"))
        return
    run = _BY_DATABASE.get((phase, ctx.database), run)
    start = time.perf_counter()
    try:
        await run(ctx)
    except Exception as exc:
        # One broken phase should not cost the figures of the others.
        traceback.print_exc()
        ctx.keep_workdir = True
        ctx.add(Result(phase, "ERROR", type(exc).__name__, note=str(exc)[:200]))
    say(f"({phase}{where}: {time.perf_counter() - start:.0f} s)")


#: #27's target for MongoDB's drain rate over PostgreSQL's, in the same run.
DRAIN_TARGET = 0.6
#: Latency figures (``Ctx.figures``, seconds) whose MongoDB/PostgreSQL ratio the summary shows,
#: for information (each database's own target is judged in its phase).
LATENCY_RATIOS = {"steady p50": "steady", "idle p50": "idle"}


def compare_databases(ctxs: Sequence[Ctx]) -> None:
    """MongoDB's drain rate over PostgreSQL's, per relay count, when both ran (target ≥ 0.6x,
    #27), and the ratios of the steady and idle p50 latencies; over each ``--kafka-security``
    protocol."""
    for security in dict.fromkeys(c.security for c in ctxs):
        by_db = {c.database: c for c in ctxs if c.security is security}
        mongo, pg = by_db.get("mongodb"), by_db.get("postgresql")
        if mongo is None or pg is None:
            continue
        over = f" over {security.label}" if mongo.security_labelled else ""
        for n in sorted(mongo.drain_rates.keys() & pg.drain_rates.keys()):
            ratio = mongo.drain_rates[n] / pg.drain_rates[n]
            figure = f"{mongo.drain_rates[n]:,.0f} / {pg.drain_rates[n]:,.0f} ev/s"
            verdict = "met" if ratio >= DRAIN_TARGET else "NOT met"
            target = f"target ≥ {DRAIN_TARGET:g}x (#27): {verdict}"
            say(
                f"drain, {n} relay(s){over}: MongoDB / PostgreSQL = {figure} = {ratio:.2f}x; "
                f"{target}"
            )
            mongo.results.append(
                Result(
                    "drain",
                    f"{n} relay(s), MongoDB / PostgreSQL{over}",
                    figure,
                    f"{ratio:.2f}x",
                    target,
                )
            )
        for key, phase in LATENCY_RATIOS.items():
            if key not in mongo.figures or key not in pg.figures:
                continue
            m, p = mongo.figures[key] * 1000, pg.figures[key] * 1000
            figure = f"{m:.1f} / {p:.1f} ms"
            say(f"{key}{over}: MongoDB / PostgreSQL = {figure} = {m / p:.2f}x")
            mongo.results.append(
                Result(
                    phase,
                    f"{key}, MongoDB / PostgreSQL{over}",
                    figure,
                    f"{m / p:.2f}x",
                    "information",
                )
            )


def report_slow_statements(log: Path, limit: int = 40) -> None:
    """The relay's statements that auto_explain logged (slower than 1 s), with the first plan:
    the relay's claims must stay fast however the table's statistics look. The relay's are those
    of its pool's sessions (application ``outboxkit-relay``: its claims and settles)."""
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if "duration:" in line and "plan:" in line]
    relay = [i for i in starts if " outboxkit-relay: " in lines[i]]
    say(
        f"\nauto_explain: {len(starts)} statement(s) slower than 1 s, {len(relay)} of them the "
        "relay's pool's (its claims)"
    )
    for i in relay[:1]:
        say("  " + lines[i][:160])
        for line in itertools.takewhile(
            lambda text: text.startswith(("\t", " ")), lines[i + 1 : i + limit]
        ):
            say("  " + line.rstrip()[:160])


def quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


class Servers:
    """The outbox databases: the one given by URL, or one started here (stopped with ``stack``)."""

    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack, cpu: CpuMeter):
        self.args = args
        self.stack = stack
        self.cpu = cpu
        self.needs_db = bool(set(args.phases) - _KAFKA_ONLY)
        self.pg_log: Path | None = None
        self.described: list[str] = []
        #: The database servers started here, by database name (for the churn phase's faults).
        self.started: dict[str, EmbeddedPostgres | EmbeddedMongo] = {}

    def outbox(self, database: str) -> BenchOutbox:
        return self.postgres() if database == "postgresql" else self.mongodb()

    def postgres(self) -> BenchOutbox:
        url = self.args.postgres or "postgresql://unused/"
        if not self.args.postgres and self.needs_db:
            pg = self.stack.enter_context(EmbeddedPostgres(settings=PG_SETTINGS))
            url, self.pg_log = pg.url(), pg.log_path
            self.started["postgresql"] = pg
            assert pg.pid is not None
            self.cpu.roots["postgres"] = [pg.pid]
        self.described.append(
            f"PostgreSQL {'at ' + self.args.postgres if self.args.postgres else 'embedded'} "
            f"({', '.join(f'{k}={v}' for k, v in PG_SETTINGS.items())})"
        )
        return PostgresBenchOutbox(url)

    def mongodb(self) -> BenchOutbox:
        url = self.args.mongodb or "mongodb://unused/"
        if not self.args.mongodb and self.needs_db:
            mongo = self.stack.enter_context(EmbeddedMongo(fetch=True, parameters=MONGO_PARAMETERS))
            url = mongo.url()
            self.started["mongodb"] = mongo
            assert mongo.pid is not None
            self.cpu.roots["mongodb"] = [mongo.pid]
            client: MongoClient[dict[str, Any]]
            with MongoClient(mongo.address, directConnection=True) as client:
                client.admin.command({"setParameter": 1, **MONGO_RUNTIME})
        self.described.append(
            f"MongoDB {'at ' + self.args.mongodb if self.args.mongodb else 'embedded'} "
            "(mongod 6.0.5, single-node replica set, "
            f"{', '.join(f'{k}={v}' for k, v in {**MONGO_PARAMETERS, **MONGO_RUNTIME}.items())}"
            "; writers commit with majority write concern, journaled)"
        )
        return MongoBenchOutbox(url)


def start_kafka(
    args: argparse.Namespace, stack: contextlib.ExitStack, cpu: CpuMeter
) -> tuple[KafkaCluster | None, str, list[KafkaSecurity], str]:
    """The broker (``--kafka``'s, or one node started here), its bootstrap servers, the
    ``--kafka-security`` protocols over it, and a description for the header."""
    if args.kafka:
        plaintext: list[KafkaSecurity] = [Plaintext(args.kafka, on_secured_broker=False)]
        return None, args.kafka, plaintext, f"at {args.kafka}"
    secured = "sasl_ssl" in args.securities
    kafka = stack.enter_context(SecuredKafkaCluster(1) if secured else KafkaCluster(1))
    bootstrap = kafka.bootstrap_servers
    pid = kafka.nodes[0].pid
    if pid is not None:
        cpu.roots["kafka"] = [pid]
    securities: list[KafkaSecurity] = [
        SaslSsl(kafka)
        if name == "sasl_ssl" and isinstance(kafka, SecuredKafkaCluster)
        else Plaintext(bootstrap, on_secured_broker=secured)
        for name in args.securities
    ]
    described = (
        "1 embedded secured node (SecuredKafkaCluster: StandardAuthorizer, ACLs "
        "enforced); the bench's own clients on its PLAINTEXT listener"
        if secured
        else "1 embedded node"
    )
    return kafka, bootstrap, securities, described


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child-relay"]:
        child_relay(argv[1:])
        return
    args = parse_args(argv)
    if args.child_consumer:
        bootstrap, topic, partitions, out = args.child_consumer
        quiet_logs()
        asyncio.run(consumer_child(bootstrap, topic, int(partitions), Path(out)))
        return
    if args.list:
        for name, run in PHASES.items():
            doc = (sys.modules[run.__module__].__doc__ or "").strip().splitlines()[0]
            say(f"{name:8} {doc}")
        return
    quiet_logs()
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="outboxkit-bench-"))
    cpu = CpuMeter()
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        servers = Servers(args, stack, cpu)
        outboxes = {db: servers.outbox(db) for db in args.databases}
        kafka, bootstrap, securities, kafka_described = start_kafka(args, stack, cpu)
        say(
            f"outboxkit relay benchmark: {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}; {'; '.join(servers.described)}; Kafka "
            f"{kafka_described}; {'; '.join(s.describe() for s in securities)}; phases "
            f"{', '.join(args.phases)}; relays as {args.relay_mode}; relay settings "
            f"{args.relay_setting or 'defaults'}; workdir {workdir}"
        )
        ctx = asyncio.run(
            run_phases(
                args,
                outboxes,
                bootstrap,
                securities,
                cpu=cpu,
                workdir=workdir,
                kafka_cluster=kafka,
                database_servers=servers.started,
            )
        )
        if servers.pg_log is not None:
            report_slow_statements(servers.pg_log)
            if ctx.keep_workdir:
                shutil.copy(servers.pg_log, workdir / "postgres.log")
    say(f"\n== summary ({time.perf_counter() - began:.0f} s in all) ==")
    print_table(ctx.results)
    if ctx.keep_workdir or ctx.order_failures:
        say(f"logs and diagnostics kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if ctx.order_failures:
        say("\nPER-KEY ORDER VIOLATED (guarantee G2):")
        for line in ctx.order_failures:
            say(f"  {line}")
        sys.exit(1)
