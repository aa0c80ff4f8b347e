"""``outboxkit demo``: starts PostgreSQL and a broker on this machine, the relay as a process, two
inboxes in this process, places orders at a steady rate, optionally SIGKILLs the relay mid-run,
waits until every event took effect, and stops everything it started.

    EmbeddedPostgres ─┬─ orders writers (place_order)       ─┐
                      ├─ relay process(es) (python -m outboxkit relay)
                      ├─ inbox demo.payments, inbox demo.orders (InboxWorker, in process)
    broker (Tansu or Apache Kafka) ─ topic reader: counts records, checks per-key order
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import psycopg
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.live import Live

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.logs import configure_logging
from outboxkit.demo import shop
from outboxkit.demo.events import OrderPlaced, registry
from outboxkit.demo.summary import (
    UNFENCED_NOTE,
    DemoSummary,
    KeyOrder,
    Latency,
    Progress,
    live_table,
)
from outboxkit.embedded import EmbeddedPostgres, EmbeddedTansu, KafkaCluster
from outboxkit.embedded._process import die_with_parent, free_port
from outboxkit.embedded.kafka import kafka_jars_dir
from outboxkit.embedded.postgres import FAST_TEST_SETTINGS
from outboxkit.inbox import Inbox, InboxMetrics, InboxSettings, InboxWorker, PostgresInboxStore
from outboxkit.migrations import migrate
from outboxkit.schemas import EventDecodeError

Broker = Literal["tansu", "kafka"]

#: Fast failover: a killed relay's partitions move after ~3 s on Kafka. Tansu makes a lone
#: member that rejoins wait about twice the session timeout.
RELAY_ENV = {
    "OUTBOXKIT_RELAY_NAME": "demo",
    "OUTBOXKIT_SESSION_TIMEOUT": "3",
    "OUTBOXKIT_HEARTBEAT_INTERVAL": "0.5",
    "OUTBOXKIT_SWEEP_INTERVAL": "1",
    "OUTBOXKIT_REVOKE_TIMEOUT": "5",
    "OUTBOXKIT_TRANSACTION_TIMEOUT": "5",
    "OUTBOXKIT_RETRY_BACKOFF_MAX": "0.5",
    "OUTBOXKIT_METRICS_INTERVAL": "1",
}
WARMUP_ORDER = shop.order_id(0)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    orders: int = 1000
    rate: float = 100.0
    kill_relay: bool = False
    broker: Broker = "tansu"
    customers: int = 20
    writers: int = 4
    partitions: int = 3
    #: Fraction of the orders placed when the relay is killed.
    kill_at: float = 0.3
    ready_timeout: float = 60.0
    drain_timeout: float = 60.0

    @property
    def transactional(self) -> bool:
        return self.broker == "kafka"


class _Server(Protocol):
    @property
    def bootstrap_servers(self) -> str: ...

    def start(self) -> Any: ...

    def close(self) -> None: ...


def run_demo(options: DemoOptions, console: Console) -> DemoSummary:
    """Run the demo; every process it starts is stopped and its directory removed, also on
    Ctrl-C / SIGTERM (KeyboardInterrupt) and errors. Raises ConfigurationError when a server
    cannot be found."""
    workdir = Path(tempfile.mkdtemp(prefix="outboxkit-demo-"))
    _log_to_file(workdir / "demo.log")
    started = time.monotonic()
    failed = True
    try:
        with contextlib.ExitStack() as stack:
            pg = EmbeddedPostgres(workdir / "postgres", settings=FAST_TEST_SETTINGS)
            broker = _broker(options, workdir)
            stack.callback(pg.close)
            stack.callback(broker.close)
            console.print(f"[dim]starting PostgreSQL and {_broker_name(options)} …[/]")
            # In this thread: a server dies with the thread that started it (PR_SET_PDEATHSIG).
            pg.start()
            broker.start()
            pids = [pid for pid in [pg.pid, *_broker_pids(broker)] if pid is not None]
            console.print(
                f"PostgreSQL on 127.0.0.1:{pg.port}, {_broker_name(options)} on "
                f"{broker.bootstrap_servers} ({time.monotonic() - started:.1f} s)"
            )
            demo = _Demo(options, console, pg.url(), broker.bootstrap_servers, workdir)
            demo.pids += pids
            try:
                summary = asyncio.run(demo.run(started))
            except asyncio.CancelledError:  # SIGTERM cancelled the run
                raise KeyboardInterrupt from None
            failed = not summary.ok
            return summary
    except (KeyboardInterrupt, ConfigurationError):
        failed = False
        raise
    finally:
        logging.shutdown()
        if failed:
            kept = _keep_logs(workdir)
            console.print(f"[yellow]the logs of the servers, relays and inboxes: {kept}[/]")
        shutil.rmtree(workdir, ignore_errors=True)


def _keep_logs(workdir: Path) -> Path:
    """When something went wrong: copy every log out of the directory about to be removed."""
    kept = Path(tempfile.mkdtemp(prefix="outboxkit-demo-logs-"))
    for log in workdir.rglob("*.log"):
        with contextlib.suppress(OSError):
            shutil.copy(log, kept / "-".join(log.relative_to(workdir).parts))
    return kept


def _broker(options: DemoOptions, workdir: Path) -> _Server:
    if options.broker == "tansu":
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
    return KafkaCluster(1, jars_dir=jars, base_dir=workdir / "kafka")


def _broker_name(options: DemoOptions) -> str:
    return "Tansu (embedded)" if options.broker == "tansu" else "Apache Kafka (embedded)"


def _broker_pids(broker: _Server) -> list[int | None]:
    if isinstance(broker, KafkaCluster):
        return [node.pid for node in broker.nodes]
    if isinstance(broker, EmbeddedTansu):
        return [broker.pid]
    return []


def _log_to_file(path: Path) -> None:
    """The workers' structured logs go to a file (removed at the end): the terminal shows the
    live summary."""
    configure_logging("console")
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(root.handlers[0].formatter)
    root.handlers[:] = [handler]


class RelayProcess:
    """``python -m outboxkit relay`` with the demo's settings; /healthz on a free port."""

    def __init__(self, number: int, env: dict[str, str], workdir: Path) -> None:
        self.number = number
        self.http_port = free_port()
        self.log_path = workdir / f"relay-{number}.log"
        self.env = {**env, "OUTBOXKIT_HTTP_PORT": str(self.http_port)}
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False

    def start(self) -> RelayProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "outboxkit", "relay"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, before exec
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.alive():
            self.process.kill()
            self.process.wait(10)
        self.killed = True

    async def stop(self, grace: float = 15.0) -> None:
        """SIGTERM: the relay drains and leaves the group; SIGKILL if it takes too long."""
        if self.process is None or not self.alive():
            return
        self.process.terminate()
        try:
            await asyncio.to_thread(self.process.wait, grace)
        except subprocess.TimeoutExpired:
            self.kill()

    async def owned_partitions(self) -> int | None:
        """How many partitions the relay owns, from its /healthz; None if it does not answer."""
        if not self.alive():
            return None
        try:
            async with asyncio.timeout(1):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.http_port)
                try:
                    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
                    await writer.drain()
                    response = await reader.read()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError):
            return None
        try:
            return len(json.loads(response.partition(b"\r\n\r\n")[2])["owned"])
        except (ValueError, KeyError, TypeError):
            return None


class TopicReader:
    """Reads both topics from the start (``read_committed``, as the inboxes do): counts records
    and distinct event ids, and checks that each customer's orders appear in order (G2)."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.records = 0
        self.per_topic = dict.fromkeys(shop.TOPICS, 0)
        self.event_ids: set[str] = set()
        self.key_order = KeyOrder()

    async def run(self, stopping: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in shop.TOPICS for p in range(self.partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while not stopping.is_set():
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        self._count(record)
        finally:
            await consumer.stop()

    def _count(self, record: ConsumerRecord[bytes, bytes]) -> None:
        self.records += 1
        self.per_topic[record.topic] += 1
        headers = dict(record.headers)
        event_id = headers.get("ce_id", b"").decode()
        if record.topic == shop.ORDERS_TOPIC:
            try:
                event = registry.decode_record(record)
            except EventDecodeError:
                return
            if isinstance(event, OrderPlaced):
                index = int(event.order_id.removeprefix("o-"))
                self.key_order.observe(event.customer_id, index, event_id)
        self.event_ids.add(event_id)


@dataclass
class _Counts:
    orders: int = 0
    payments: int = 0
    paid: int = 0
    backlog: int = 0

    @property
    def written(self) -> int:
        return self.orders + self.payments

    @property
    def handled(self) -> int:
        return self.payments + self.paid


@dataclass
class _Demo:
    options: DemoOptions
    console: Console
    pg_url: str
    bootstrap: str
    workdir: Path
    pids: list[int] = field(default_factory=list)
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)
    relays: list[RelayProcess] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    takeovers: list[float] = field(default_factory=list)
    _killed_at: float | None = None
    _started: float = 0.0

    # -- the run -----------------------------------------------------------------------------

    async def run(self, started: float) -> DemoSummary:
        self._started = started
        o = self.options
        self.progress.orders_target = o.orders
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        assert main is not None
        loop.add_signal_handler(signal.SIGTERM, main.cancel)
        await self._prepare()
        metrics = self.metrics
        stopping = asyncio.Event()
        reader = TopicReader(self.bootstrap, o.partitions)
        inboxes = [shop.payments_inbox, shop.orders_inbox]
        live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(self._stop_relays)
            self._start_relay()
            shared = InboxMetrics(metrics)  # one set of metrics, labelled by inbox
            workers = [
                self._inbox_worker(inbox, topic, shared)
                for inbox, topic in zip(inboxes, shop.TOPICS, strict=True)
            ]
            stores = [await stack.enter_async_context(store) for _, store in workers]
            del stores
            tasks = [asyncio.create_task(w.run(), name=w.inbox.name) for w, _ in workers]
            tasks.append(asyncio.create_task(reader.run(stopping), name="reader"))
            stack.push_async_exit(_TaskStopper(tasks, [w for w, _ in workers], stopping))
            stack.enter_context(live)
            monitor = asyncio.create_task(self._monitor(live, reader, metrics, tasks))
            stack.push_async_callback(_cancel, monitor)
            await _supervised(self._steps(reader), monitor)
            self._phase("stopping")
            counts = await self._counts()
            latencies = await self._latencies()
        return DemoSummary(
            broker=o.broker,
            transactional=o.transactional,
            orders=counts.orders,
            events_written=counts.written,
            events_published=reader.records,
            duplicates_published=reader.records - len(reader.event_ids),
            events_handled=counts.handled,
            duplicates_absorbed=_metric_sum(metrics, "outboxkit_inbox_duplicates_total"),
            dead_lettered=_metric_sum(metrics, "outboxkit_inbox_dead_lettered_total"),
            lost=counts.written - counts.handled,
            key_order_violations=len(reader.key_order.violations),
            latency_ms=Latency.of_seconds(latencies[0]),
            round_trip_ms=Latency.of_seconds(latencies[1]),
            relay_kills=sum(r.killed for r in self.relays),
            takeover_seconds=[round(t, 1) for t in self.takeovers],
            seconds=round(time.monotonic() - self._started, 1),
            pids=self.pids,
            workdir=str(self.workdir),
            note=None if o.transactional else UNFENCED_NOTE,
        )

    async def _steps(self, reader: TopicReader) -> None:
        await self._wait_ready()
        await self._write_orders()
        await self._drain(reader)

    async def _prepare(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.pg_url, autocommit=True) as conn:
            await migrate(conn)
            await conn.execute(shop.SCHEMA)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            p = self.options.partitions
            await admin.create_topics(
                [NewTopic(t, p, 1) for t in shop.TOPICS]
                + [NewTopic(f"{t}.dlq", 1, 1) for t in shop.TOPICS]
            )
        finally:
            await admin.close()

    def _start_relay(self) -> RelayProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
        env |= RELAY_ENV | {
            "OUTBOXKIT_DATABASE_URL": self.pg_url,
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "OUTBOXKIT_TOPICS": ",".join(shop.TOPICS),
            "OUTBOXKIT_TRANSACTIONAL": "true" if self.options.transactional else "false",
        }
        relay = RelayProcess(len(self.relays) + 1, env, self.workdir).start()
        self.relays.append(relay)
        self.pids.append(relay.pid)
        self._event(f"relay #{relay.number} started (pid {relay.pid})")
        return relay

    async def _stop_relays(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # Interrupted (Ctrl-C also reached the servers): no time for a graceful drain.
        grace = 15.0 if exc_type is None else 2.0
        for relay in self.relays:
            await relay.stop(grace)

    def _inbox_worker(
        self, inbox: Inbox, topic: str, metrics: InboxMetrics
    ) -> tuple[InboxWorker, PostgresInboxStore]:
        settings = InboxSettings(
            database_url=self.pg_url,
            kafka_bootstrap_servers=[self.bootstrap],
            topics=[topic],
            session_timeout=3.0,
            heartbeat_interval=0.5,
            retry_backoff_max=0.5,
            dlq_idempotence=self.options.transactional,
        )
        store = PostgresInboxStore(self.pg_url, pool_size=4)
        return InboxWorker(inbox, settings, store, metrics=metrics), store

    async def _wait_ready(self) -> None:
        """Place one order once the relay registered the topics, and wait until it is paid:
        then the relay and both inboxes own their partitions."""
        self._phase("consumer groups forming")
        begin = time.monotonic()
        async with await psycopg.AsyncConnection.connect(self.pg_url, autocommit=True) as conn:
            async with asyncio.timeout(self.options.ready_timeout):
                while True:
                    cur = await conn.execute(
                        "SELECT count(*) FROM outboxkit.topics WHERE topic = ANY(%s)",
                        (list(shop.TOPICS),),
                    )
                    row = await cur.fetchone()
                    if row and row[0] == len(shop.TOPICS):
                        break
                    await asyncio.sleep(0.1)
                await shop.place_order(conn, shop.make_order(0, 1, random.Random(0)))
                while True:
                    cur = await conn.execute(
                        "SELECT paid_at IS NOT NULL FROM demo.orders WHERE order_id = %s",
                        (WARMUP_ORDER,),
                    )
                    row = await cur.fetchone()
                    if row and row[0]:
                        break
                    await asyncio.sleep(0.05)
        self._event(
            f"pipeline ready in {time.monotonic() - begin:.1f} s: "
            "the first order was relayed, paid and confirmed"
        )

    async def _write_orders(self) -> None:
        o = self.options
        self._phase("placing orders")
        writers = max(1, min(o.writers, o.customers))
        loop = asyncio.get_running_loop()
        start_at = loop.time()
        placed = 1  # the warm-up order
        kill_after = round(o.orders * o.kill_at) if o.kill_relay else None

        async def write(w: int) -> None:
            nonlocal placed
            rng = random.Random(w)
            # One customer's orders are placed in series, by one writer, in index order.
            indexes = [i for i in range(1, o.orders) if (i % o.customers) % writers == w]
            async with await psycopg.AsyncConnection.connect(self.pg_url, autocommit=True) as c:
                for i in indexes:
                    delay = start_at + (i - 1) / o.rate - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await shop.place_order(c, shop.make_order(i, o.customers, rng))
                    placed += 1
                    self.progress.orders_written = placed
                    if kill_after is not None and placed >= kill_after and not self._killed_at:
                        self._kill_relay(placed)

        self.progress.orders_written = placed
        await asyncio.gather(*(write(w) for w in range(writers)))
        self._event(f"all {placed} orders placed ({loop.time() - start_at:.1f} s)")

    def _kill_relay(self, placed: int) -> None:
        victim = self.relays[-1]
        victim.kill()
        self._killed_at = time.monotonic()
        self._event(f"[bold red]relay #{victim.number} SIGKILLed[/] after {placed} orders")
        self._start_relay()

    async def _drain(self, reader: TopicReader) -> None:
        """Wait until every event written took effect, the outbox is empty (re-sends included),
        and the inboxes consumed every record the reader saw, for a second in a row: then the
        counts of re-sent and absorbed records are final."""
        self._phase("draining")
        settled_since: float | None = None
        try:
            async with asyncio.timeout(self.options.drain_timeout):
                while True:
                    counts = await self._counts()
                    consumed = {
                        topic: _metric_sum(
                            self.metrics, "outboxkit_inbox_consumed_total", topic=topic
                        )
                        for topic in shop.TOPICS
                    }
                    settled = (
                        counts.handled == counts.written
                        and counts.backlog == 0
                        and (self._killed_at is None or bool(self.takeovers))
                        and len(reader.event_ids) >= counts.written
                        and consumed == reader.per_topic
                    )
                    now = time.monotonic()
                    if not settled:
                        settled_since = None
                    elif settled_since is None:
                        settled_since = now
                    elif now - settled_since >= 1.0:
                        break
                    await asyncio.sleep(0.1)
        except TimeoutError:
            self._event(f"[red]not drained after {self.options.drain_timeout:.0f} s[/]")
            return
        self._event("every event took effect")

    # -- watching ----------------------------------------------------------------------------

    async def _monitor(
        self,
        live: Live,
        reader: TopicReader,
        metrics: CollectorRegistry,
        tasks: list[asyncio.Task[None]],
    ) -> None:
        p = self.progress
        async with await psycopg.AsyncConnection.connect(self.pg_url, autocommit=True) as conn:
            while True:
                for task in tasks:
                    if task.done():
                        task.result()  # a dead worker stops the demo loudly
                counts = await self._counts(conn)
                p.events_written = counts.written
                p.backlog = counts.backlog
                p.handled = counts.handled
                p.published = reader.records
                p.published_distinct = len(reader.event_ids)
                p.duplicates_absorbed = _metric_sum(metrics, "outboxkit_inbox_duplicates_total")
                p.dead_lettered = _metric_sum(metrics, "outboxkit_inbox_dead_lettered_total")
                p.latency = Latency.of_seconds((await self._latencies(conn, limit=5000))[0])
                p.relay = await self._relay_state()
                p.seconds = time.monotonic() - self._started
                live.update(self._render())
                await asyncio.sleep(0.25)

    async def _relay_state(self) -> str:
        relay = self.relays[-1]
        total = self.options.partitions * len(shop.TOPICS)
        owned = await relay.owned_partitions()
        if owned == total and self._killed_at is not None and len(self.takeovers) == 0:
            self.takeovers.append(time.monotonic() - self._killed_at)
            self._event(
                f"relay #{relay.number} took over all {total} partitions "
                f"{self.takeovers[-1]:.1f} s after the kill"
            )
        state = f"#{relay.number} pid {relay.pid}, owns {owned or 0}/{total} partitions"
        if self._killed_at is not None:
            state = f"#1 SIGKILLed · {state}"
        return state

    def _render(self) -> Any:
        title = f"outboxkit demo · PostgreSQL + {_broker_name(self.options)}"
        return live_table(self.progress, title)

    def _phase(self, phase: str) -> None:
        self.progress.phase = phase

    def _event(self, message: str) -> None:
        elapsed = time.monotonic() - self._started
        self.console.print(f"[dim]{elapsed:6.1f} s[/]  {message}")

    # -- the database ------------------------------------------------------------------------

    async def _counts(self, conn: psycopg.AsyncConnection[Any] | None = None) -> _Counts:
        async with self._connection(conn) as c:
            cur = await c.execute(
                """
                SELECT (SELECT count(*) FROM demo.orders),
                       (SELECT count(*) FROM demo.payments),
                       (SELECT count(*) FROM demo.orders WHERE paid_at IS NOT NULL),
                       (SELECT count(*) FROM outboxkit.outbox WHERE state = 'pending')
                """
            )
            row = await cur.fetchone()
            assert row is not None
            return _Counts(*row)

    async def _latencies(
        self, conn: psycopg.AsyncConnection[Any] | None = None, *, limit: int | None = None
    ) -> tuple[list[float], list[float]]:
        """Seconds from each order's commit to its payment's commit, and to its paid mark
        (the warm-up order, which waited for the consumer groups, is left out)."""
        async with self._connection(conn) as c:
            cur = await c.execute(
                """
                SELECT extract(epoch FROM p.captured_at - o.placed_at)::float8,
                       extract(epoch FROM o.paid_at - o.placed_at)::float8
                FROM demo.payments p JOIN demo.orders o USING (order_id)
                WHERE o.order_id <> %s
                ORDER BY p.captured_at DESC
                LIMIT %s
                """,
                (WARMUP_ORDER, limit),
            )
            rows = await cur.fetchall()
        return [r[0] for r in rows], [r[1] for r in rows if r[1] is not None]

    @contextlib.asynccontextmanager
    async def _connection(
        self, conn: psycopg.AsyncConnection[Any] | None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if conn is not None:
            yield conn
            return
        async with await psycopg.AsyncConnection.connect(self.pg_url, autocommit=True) as new:
            yield new


def _metric_sum(metrics: CollectorRegistry, name: str, **labels: str) -> int:
    return int(
        sum(
            s.value
            for m in metrics.collect()
            for s in m.samples
            if s.name == name and labels.items() <= s.labels.items()
        )
    )


class _TaskStopper:
    """Asks the inboxes and the reader to finish (commit, leave the group), then cancels what is
    left after a few seconds (at once when the run was interrupted)."""

    def __init__(
        self, tasks: list[asyncio.Task[None]], workers: list[InboxWorker], stopping: asyncio.Event
    ) -> None:
        self.tasks, self.workers, self.stopping = tasks, workers, stopping

    async def __call__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.stopping.set()
        for worker in self.workers:
            worker.stop()
        _, pending = await asyncio.wait(self.tasks, timeout=5 if exc_type is None else 1)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _supervised(steps: Coroutine[Any, Any, None], monitor: asyncio.Task[None]) -> None:
    """Run ``steps``; if the monitor dies first (it re-raises a dead worker's error), stop."""
    task = asyncio.create_task(steps, name="steps")
    try:
        done, _ = await asyncio.wait({task, monitor}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            await _cancel(task)
    if monitor in done:
        monitor.result()
        raise RuntimeError("the monitor stopped")
    task.result()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
