"""``outboxkit demo``: starts a database and a broker on this machine, the relay as a process, two
inboxes in this process, places orders at a steady rate, optionally SIGKILLs the relay mid-run,
waits until every event took effect, and stops everything it started.

    PostgreSQL or MongoDB ─┬─ orders writers (Shop.place_order)
                           ├─ relay process(es) (python -m outboxkit relay)
                           ├─ inbox demo.payments, inbox demo.orders (InboxWorker, in process)
    broker (Tansu or Apache Kafka) ─ topic reader: counts records, checks per-key order

The database is reached through :mod:`outboxkit.backends` (migrations, topics, the outbox backlog,
the inbox stores) and the shop (:mod:`.shop`: the services' own tables and handlers); nothing
here knows which database it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import NewTopic
from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.live import Live

from outboxkit.backends import backend_for
from outboxkit.core import kafka_clients
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.logs import configure_logging
from outboxkit.core.settings import ConnectionSettings, open_broker
from outboxkit.demo import shop
from outboxkit.demo.events import OrderPlaced, registry
from outboxkit.demo.relay_process import RELAY_ENV, RelayProcess
from outboxkit.demo.servers import (
    DATABASE_NAMES,
    Broker,
    Database,
    DemoDatabase,
    broker_name,
    broker_pids,
    make_broker,
    start_database,
)
from outboxkit.demo.shop import Shop, open_shop
from outboxkit.demo.summary import (
    UNFENCED_NOTE,
    DemoSummary,
    KeyOrder,
    Latency,
    Progress,
    live_table,
)
from outboxkit.inbox import Inbox, InboxMetrics, InboxSettings, InboxWorker
from outboxkit.relay import OutboxStorage
from outboxkit.schemas import EventDecodeError


@dataclass(frozen=True, slots=True)
class DemoOptions:
    orders: int = 1000
    rate: float = 100.0
    kill_relay: bool = False
    broker: Broker = "tansu"
    database: Database = "postgresql"
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
            broker = make_broker(options.broker, workdir)
            stack.callback(broker.close)
            servers = f"{DATABASE_NAMES[options.database]} and {broker_name(options.broker)}"
            console.print(f"[dim]starting {servers} …[/]")
            # In this thread: a server dies with the thread that started it (PR_SET_PDEATHSIG).
            database = start_database(options.database, workdir, stack, console)
            broker.start()
            console.print(
                f"{database.where}, {broker_name(options.broker)} on "
                f"{broker.bootstrap_servers} ({time.monotonic() - started:.1f} s)"
            )
            run = _run(
                options,
                console=console,
                database=database,
                bootstrap=broker.bootstrap_servers,
                workdir=workdir,
                pids=database.pids + broker_pids(broker),
                started=started,
            )
            try:
                summary = asyncio.run(run)
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


async def _run(
    options: DemoOptions,
    *,
    console: Console,
    database: DemoDatabase,
    bootstrap: str,
    workdir: Path,
    pids: list[int],
    started: float,
) -> DemoSummary:
    """The demo on ``database``: its shop and the outbox stay open until the relays and the
    inboxes stopped."""
    url = database.url
    async with (
        open_shop(url, pool_size=options.writers + 4) as shop_,
        backend_for(url).outbox_storage(ConnectionSettings(database_url=url)) as outbox,
    ):
        demo = _Demo(options, console, database, bootstrap, workdir, shop_, outbox, pids)
        return await demo.run(started)


def _keep_logs(workdir: Path) -> Path:
    """When something went wrong: copy every log out of the directory about to be removed."""
    kept = Path(tempfile.mkdtemp(prefix="outboxkit-demo-logs-"))
    for log in workdir.rglob("*.log"):
        with contextlib.suppress(OSError):
            shutil.copy(log, kept / "-".join(log.relative_to(workdir).parts))
    return kept


def _log_to_file(path: Path) -> None:
    """The workers' structured logs go to a file (removed at the end): the terminal shows the
    live summary."""
    configure_logging("console")
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(root.handlers[0].formatter)
    root.handlers[:] = [handler]


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
        consumer = kafka_clients.consumer(
            open_broker([self.bootstrap]),
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


@dataclass(frozen=True, slots=True)
class _Counts:
    """The shop's counts and the outbox backlog (pending records)."""

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
    database: DemoDatabase
    bootstrap: str
    workdir: Path
    #: The shop's tables and handlers, and the outbox (backlog, topics), open during the run.
    shop: Shop
    outbox: OutboxStorage
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
        metrics = self.metrics
        stopping = asyncio.Event()
        reader = TopicReader(self.bootstrap, o.partitions)
        live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
        backend = backend_for(self.database.url)
        await self._prepare()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(self._stop_relays)
            self._start_relay()
            shared = InboxMetrics(metrics)  # one set of metrics, labelled by inbox
            workers = [
                InboxWorker(
                    inbox,
                    settings,
                    await stack.enter_async_context(backend.inbox_store(settings)),
                    metrics=shared,
                )
                for inbox, settings in self._inboxes()
            ]
            tasks = [asyncio.create_task(w.run(), name=w.inbox.name) for w in workers]
            tasks.append(asyncio.create_task(reader.run(stopping), name="reader"))
            stack.push_async_exit(_TaskStopper(tasks, workers, stopping))
            stack.enter_context(live)
            monitor = asyncio.create_task(self._monitor(live, reader, metrics, tasks))
            stack.push_async_callback(_cancel, monitor)
            await _supervised(self._steps(reader), monitor)
            self._phase("stopping")
            counts = await self._counts()
            latencies = await self.shop.latencies()
        return DemoSummary(
            database=self.database.kind,
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
        """outboxkit's migrations, the shop's tables, the topics — and their partition counts
        registered, as ``outboxkit topics sync`` does: a writer needs them to place a record in
        its partition (the relay registers them too, once it has joined)."""
        await backend_for(self.database.url).migrate(connect_timeout=10.0)
        await self.shop.create()
        admin = kafka_clients.admin(open_broker([self.bootstrap]))
        await admin.start()
        try:
            p = self.options.partitions
            await admin.create_topics(
                [NewTopic(t, p, 1) for t in shop.TOPICS]
                + [NewTopic(f"{t}.dlq", 1, 1) for t in shop.TOPICS]
            )
        finally:
            await admin.close()
        await self.outbox.register_topics(dict.fromkeys(shop.TOPICS, p))

    def _start_relay(self) -> RelayProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
        env |= RELAY_ENV | {
            "OUTBOXKIT_DATABASE_URL": self.database.url,
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

    def _inboxes(self) -> list[tuple[Inbox[Any], InboxSettings]]:
        """The payments service's inbox on orders, the orders service's on payments."""
        inboxes = [self.shop.payments_inbox, self.shop.orders_inbox]
        return [
            (
                inbox,
                InboxSettings(
                    database_url=self.database.url,
                    kafka_bootstrap_servers=[self.bootstrap],
                    topics=[topic],
                    pool_size=4,
                    session_timeout=3.0,
                    heartbeat_interval=0.5,
                    retry_backoff_max=0.5,
                    dlq_idempotence=self.options.transactional,
                ),
            )
            for inbox, topic in zip(inboxes, shop.TOPICS, strict=True)
        ]

    async def _wait_ready(self) -> None:
        """Place one order and wait until it is paid: then the relay and both inboxes own their
        partitions."""
        self._phase("consumer groups forming")
        begin = time.monotonic()
        async with asyncio.timeout(self.options.ready_timeout):
            await self.shop.place_order(shop.make_order(0, 1, random.Random(0)))
            while True:
                if await self.shop.is_paid(shop.WARMUP_ORDER):
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
            for i in indexes:
                delay = start_at + (i - 1) / o.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self.shop.place_order(shop.make_order(i, o.customers, rng))
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
        while True:
            for task in tasks:
                if task.done():
                    task.result()  # a dead worker stops the demo loudly
            counts = await self._counts()
            p.events_written = counts.written
            p.backlog = counts.backlog
            p.handled = counts.handled
            p.published = reader.records
            p.published_distinct = len(reader.event_ids)
            p.duplicates_absorbed = _metric_sum(metrics, "outboxkit_inbox_duplicates_total")
            p.dead_lettered = _metric_sum(metrics, "outboxkit_inbox_dead_lettered_total")
            p.latency = Latency.of_seconds((await self.shop.latencies(limit=5000))[0])
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
        title = f"outboxkit demo · {self.database.name} + {broker_name(self.options.broker)}"
        return live_table(self.progress, title)

    def _phase(self, phase: str) -> None:
        self.progress.phase = phase

    def _event(self, message: str) -> None:
        elapsed = time.monotonic() - self._started
        self.console.print(f"[dim]{elapsed:6.1f} s[/]  {message}")

    # -- the database ------------------------------------------------------------------------

    async def _counts(self) -> _Counts:
        counts = await self.shop.counts()
        backlog = sum(partition.pending for partition in await self.outbox.backlog())
        return _Counts(counts.orders, counts.payments, counts.paid, backlog)


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
