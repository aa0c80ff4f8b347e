"""``outboxkit demo``: starts a database and a broker on this machine and runs the shop on them as
services run: each service with its :class:`~outboxkit.service.Outboxkit` (its writer and its
inbox), the relay as a process of its own, which ``--kill-relay`` SIGKILLs mid-run and replaces.
It places orders at a steady rate, waits until every event took effect, and stops everything.

    PostgreSQL or MongoDB ─┬─ orders service (Outboxkit): places orders; inbox demo.orders
                           ├─ payments service (Outboxkit): inbox demo.payments
                           └─ relay process(es) (python -m outboxkit relay)
    broker (Tansu or Apache Kafka) ─ topic reader: counts records, checks per-key order

Only the URL says which database it runs on: outboxkit finds its backend from it, and the shop
its own tables (:func:`.shop.shop_for`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.live import Live

from outboxkit import ConfigurationError, ConnectionSettings, configure_logging
from outboxkit.backends import backend_for, sync_topics
from outboxkit.demo import servers, shop
from outboxkit.demo.events import OrderPlaced, registry
from outboxkit.demo.relay_process import RELAY_ENV, RelayProcess
from outboxkit.demo.summary import (
    UNFENCED_NOTE,
    DemoSummary,
    KeyOrder,
    Latency,
    Progress,
    live_table,
)
from outboxkit.embedded import create_topics
from outboxkit.inbox import Inbox, InboxSettings
from outboxkit.relay import OutboxStorage
from outboxkit.schemas import EventDecodeError
from outboxkit.service import Outboxkit


@dataclass(frozen=True, slots=True)
class DemoOptions:
    orders: int = 1000
    rate: float = 100.0
    kill_relay: bool = False
    broker: servers.Broker = "tansu"
    database: servers.Database = "postgresql"
    customers: int = 20
    writers: int = 4
    partitions: int = 3
    #: Fraction of the orders placed when the relay is killed.
    kill_at: float = 0.3
    ready_timeout: float = 60.0
    drain_timeout: float = 60.0

    @property
    def transactional(self) -> bool:
        return self.broker == "kafka"  # Tansu has no Kafka transactions


def run_demo(options: DemoOptions, console: Console) -> DemoSummary:
    """Run the demo; every process it starts is stopped and its directory removed, also on
    Ctrl-C / SIGTERM (KeyboardInterrupt) and errors, which keep the logs. Raises
    ConfigurationError when a server cannot be found."""
    workdir = Path(tempfile.mkdtemp(prefix="outboxkit-demo-"))
    _log_to_file(workdir / "demo.log")
    started = time.monotonic()
    failed = True
    try:
        with contextlib.ExitStack() as stack:
            broker = servers.make_broker(options.broker, workdir)
            stack.callback(broker.close)
            names = f"{servers.DATABASE_NAMES[options.database]} and "
            console.print(f"[dim]starting {names}{servers.broker_name(options.broker)} …[/]")
            # In this thread: a server dies with the thread that started it (PR_SET_PDEATHSIG).
            database = servers.start_database(options.database, workdir, stack, console)
            broker.start()
            console.print(
                f"{database.where}, {servers.broker_name(options.broker)} on "
                f"{broker.bootstrap_servers} ({time.monotonic() - started:.1f} s)"
            )
            pids = database.pids + servers.broker_pids(broker)
            demo = _Demo(options, console, database, broker.bootstrap_servers, workdir, pids)
            try:
                summary = asyncio.run(demo.run(started))
            except BaseException:
                if demo.interrupted:  # what failed then failed because the servers stopped too
                    raise KeyboardInterrupt from None
                raise
            failed = not summary.ok
            return summary
    except (KeyboardInterrupt, ConfigurationError):
        failed = False
        raise
    finally:
        logging.shutdown()  # and what is logged later is dropped: its file is removed
        logging.getLogger().handlers[:] = [logging.NullHandler()]
        if failed:  # copy every log out of the directory about to be removed
            kept = Path(tempfile.mkdtemp(prefix="outboxkit-demo-logs-"))
            for log in workdir.rglob("*.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(log, kept / "-".join(log.relative_to(workdir).parts))
            console.print(f"[yellow]the logs of the servers, relays and inboxes: {kept}[/]")
        shutil.rmtree(workdir, ignore_errors=True)


def _log_to_file(path: Path) -> None:
    """The services' structured logs go to a file: the terminal shows the live summary."""
    configure_logging("console")
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(root.handlers[0].formatter)
    root.handlers[:] = [handler]


class TopicReader:
    """Reads both topics from the start (``read_committed``, as the inboxes do): counts records
    and distinct event ids, and checks that each customer's orders appear in order (G2)."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        self.bootstrap, self.partitions = bootstrap, partitions
        self.records = 0
        self.per_topic = dict.fromkeys(shop.TOPICS, 0)
        self.event_ids: set[str] = set()
        self.key_order = KeyOrder()

    async def run(self, stopping: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, isolation_level="read_committed"
        )
        await consumer.start()
        try:
            consumer.assign(
                [TopicPartition(t, p) for t in shop.TOPICS for p in range(self.partitions)]
            )
            await consumer.seek_to_beginning()
            while not stopping.is_set():
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        self._count(record)
        finally:
            await consumer.stop()

    def _count(self, record: ConsumerRecord[bytes, bytes]) -> None:
        self.records += 1
        self.per_topic[record.topic] += 1
        event_id = dict(record.headers).get("ce_id", b"").decode()
        self.event_ids.add(event_id)
        with contextlib.suppress(EventDecodeError):
            event = registry.decode_record(record)
            if isinstance(event, OrderPlaced):
                index = int(event.order_id.removeprefix("o-"))
                self.key_order.observe(event.customer_id, index, event_id)


class _Demo:
    """One run on started servers: the shop's two services, the relay processes, the reader and
    the live table, refreshed by a watcher that the steps wait on."""

    #: The outbox's backlog, read while the services run.
    outbox: OutboxStorage

    def __init__(  # noqa: PLR0917 - what run_demo started
        self,
        options: DemoOptions,
        console: Console,
        database: servers.DemoDatabase,
        bootstrap: str,
        workdir: Path,
        pids: list[int],
    ) -> None:
        self.options, self.console, self.database = options, console, database
        self.bootstrap, self.workdir, self.pids = bootstrap, workdir, pids
        self.shop = shop.shop_for(database.url)
        self.reader = TopicReader(bootstrap, options.partitions)
        self.progress = Progress(orders_target=options.orders)
        self.refreshed = asyncio.Condition()
        self.settled_since: float | None = None
        self.relays: list[RelayProcess] = []
        self.takeovers: list[float] = []
        self.killed_at: float | None = None
        self.interrupted = False
        # The payments service consumes the orders, the orders service the payments.
        self.payments = self._service(shop.PAYMENTS_SOURCE, self.shop.payments_inbox, "orders")
        self.orders = self._service(shop.ORDERS_SOURCE, self.shop.orders_inbox, "payments")

    def _service(self, source: str, inbox: Inbox[Any], consumes: str) -> Outboxkit[Any]:
        """A service of the shop: its writer and its inbox, whose short group timeouts make a
        takeover quick; its metrics in a registry of its own (two services, one process)."""
        settings = InboxSettings(
            database_url=self.database.url,
            kafka_bootstrap_servers=[self.bootstrap],
            topics=[f"shop.{consumes}"],
            pool_size=4,
            session_timeout=3.0,  # production defaults: 10 s, 1 s
            heartbeat_interval=0.5,
            retry_backoff_max=0.5,
            dlq_idempotence=self.options.transactional,  # Tansu has no idempotent producer
        )
        return Outboxkit[Any](
            source=source,
            inbox=inbox,
            inbox_settings=settings,
            pool_size=self.options.writers + 4,
            registry=CollectorRegistry(),
        )

    async def run(self, started: float) -> DemoSummary:
        self.started = started
        main = asyncio.current_task()
        assert main is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, self._interrupt, main)
        await self._prepare()
        title = (
            f"outboxkit demo · {self.database.name} + {servers.broker_name(self.options.broker)}"
        )
        live = Live(console=self.console, refresh_per_second=4, transient=True)
        async with (
            backend_for(self.database.url).outbox_storage(self._connection()) as self.outbox,
            self.payments,
            self.orders,
            contextlib.AsyncExitStack() as stack,
        ):
            await self.orders.run_transaction(self.shop.create)
            stack.push_async_exit(self._stop)
            self._start_relay()
            with live:
                async with asyncio.TaskGroup() as tasks:
                    stopping = asyncio.Event()
                    tasks.create_task(self.reader.run(stopping), name="reader")
                    watcher = tasks.create_task(self._watch(live, title), name="watcher")
                    try:
                        await self._wait_ready()
                        await self._place_orders()
                        await self._drain()
                    finally:
                        stopping.set()
                        watcher.cancel()
            return await self._summary()

    def _connection(self) -> ConnectionSettings:
        return ConnectionSettings(
            database_url=self.database.url, kafka_bootstrap_servers=[self.bootstrap]
        )

    async def _prepare(self) -> None:
        """What a deploy runs before the services start: outboxkit's migrations, the topics,
        and their partition counts registered (``outboxkit topics sync``): a writer needs them
        to place its event in a partition."""
        await backend_for(self.database.url).migrate(connect_timeout=10.0)
        await create_topics(
            self.bootstrap,
            dict.fromkeys(shop.TOPICS, self.options.partitions)
            | {f"{topic}.dlq": 1 for topic in shop.TOPICS},
        )
        await sync_topics(self._connection(), shop.TOPICS)

    async def _place(self, order: OrderPlaced) -> None:
        """The orders service: the order's row and its event commit together, or neither does
        (retried from the start on MongoDB's write conflicts)."""

        async def work(tx: Any) -> None:
            await self.shop.insert_order(tx, order)
            await self.orders.add(tx, order)

        await self.orders.run_transaction(work)

    async def _wait_ready(self) -> None:
        """Place one order and wait until it is paid: then the relay and both inboxes own their
        partitions."""
        self.progress.phase = "consumer groups forming"
        begin = time.monotonic()
        await self._place(shop.make_order(0, 1, random.Random(0)))
        async with asyncio.timeout(self.options.ready_timeout), self.refreshed:
            # Its payment and its paid mark: both events of the warm-up order took effect.
            await self.refreshed.wait_for(lambda: self.progress.handled == 2)
        self._event(
            f"pipeline ready in {time.monotonic() - begin:.1f} s: "
            "the first order was relayed, paid and confirmed"
        )

    async def _place_orders(self) -> None:
        o, p = self.options, self.progress
        p.phase = "placing orders"
        writers = max(1, min(o.writers, o.customers))
        loop = asyncio.get_running_loop()
        start_at = loop.time()
        p.orders_written = 1  # the warm-up order
        kill_after = round(o.orders * o.kill_at) if o.kill_relay else o.orders + 1

        async def write(w: int) -> None:
            rng = random.Random(w)
            # One customer's orders are placed in series, by one writer, in index order.
            for i in [i for i in range(1, o.orders) if (i % o.customers) % writers == w]:
                await asyncio.sleep(start_at + (i - 1) / o.rate - loop.time())
                await self._place(shop.make_order(i, o.customers, rng))
                p.orders_written += 1
                if p.orders_written >= kill_after and self.killed_at is None:
                    self._kill_relay()

        await asyncio.gather(*(write(w) for w in range(writers)))
        self._event(f"all {p.orders_written} orders placed ({loop.time() - start_at:.1f} s)")

    def _kill_relay(self) -> None:
        victim = self.relays[-1]
        victim.kill()
        self.killed_at = time.monotonic()
        placed = self.progress.orders_written
        self._event(f"[bold red]relay #{victim.number} SIGKILLed[/] after {placed} orders")
        self._start_relay()

    async def _drain(self) -> None:
        """Wait until everything settled for a second in a row (see :meth:`_watch`): then the
        counts of re-sent and absorbed records are final."""
        self.progress.phase = "draining"
        try:
            async with asyncio.timeout(self.options.drain_timeout), self.refreshed:
                await self.refreshed.wait_for(
                    lambda: (
                        self.settled_since is not None
                        and time.monotonic() - self.settled_since >= 1.0
                    )
                )
        except TimeoutError:
            self._event(f"[red]not drained after {self.options.drain_timeout:.0f} s[/]")
            return
        self._event("every event took effect")

    async def _watch(self, live: Live, title: str) -> None:
        """Every quarter second: what the database, the outbox, the topics and the inboxes say,
        into the live table; settled when every event written took effect, the outbox is empty
        (re-sends included) and the inboxes consumed every record the reader saw. A service
        whose inbox died stops the demo, loudly."""
        p = self.progress
        while True:
            for service in (self.payments, self.orders):
                if not service.alive:
                    raise RuntimeError(f"{service.source}: {service.health().failed}")
            counts, p.backlog = await self._counts()
            p.events_written, p.handled = counts.written, counts.handled
            p.published, p.published_distinct = self.reader.records, len(self.reader.event_ids)
            p.duplicates_absorbed = self._metric("duplicates")
            p.dead_lettered = self._metric("dead_lettered")
            p.latency = Latency.of_seconds((await self._latencies(5000))[0])
            p.relay = await self._relay_state()
            p.seconds = time.monotonic() - self.started
            live.update(live_table(p, title))
            settled = (
                p.handled == p.events_written
                and p.backlog == 0
                and (self.killed_at is None or bool(self.takeovers))
                and p.published_distinct >= p.events_written
                and self.reader.per_topic
                == {t: self._metric("consumed", topic=t) for t in shop.TOPICS}
            )
            self.settled_since = (self.settled_since or time.monotonic()) if settled else None
            async with self.refreshed:
                self.refreshed.notify_all()
            await asyncio.sleep(0.25)

    async def _relay_state(self) -> str:
        """The newest relay's partitions, from its /healthz: when it owns them all after a
        kill, that is the takeover."""
        relay = self.relays[-1]
        total = self.options.partitions * len(shop.TOPICS)
        owned = await relay.owned_partitions()
        if owned == total and self.killed_at is not None and not self.takeovers:
            self.takeovers.append(time.monotonic() - self.killed_at)
            self._event(
                f"relay #{relay.number} took over all {total} partitions "
                f"{self.takeovers[-1]:.1f} s after the kill"
            )
        state = f"#{relay.number} pid {relay.pid}, owns {owned or 0}/{total} partitions"
        return state if self.killed_at is None else f"#1 SIGKILLed · {state}"

    def _start_relay(self) -> None:
        """``outboxkit relay`` as its own process, configured as any deployment: OUTBOXKIT_*."""
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

    def _interrupt(self, main: asyncio.Task[DemoSummary]) -> None:
        """Ctrl-C or SIGTERM: the run stops, and what it started (Ctrl-C reaches the servers
        too, which leaves nothing to drain into)."""
        self.interrupted = True
        main.cancel()

    async def _stop(self, *_: object) -> None:
        """At the end the relays drain (SIGTERM) and the services stop as services do. When
        interrupted, with the servers gone, the relays get two seconds and the inboxes one:
        their tasks are cancelled, then cancelled again while they try to leave their groups
        on a broker that will not answer."""
        if self.interrupted:
            for task in [t for s in (self.payments, self.orders) for t in s.tasks.values()]:
                task.cancel()
                asyncio.get_running_loop().call_later(1.0, task.cancel)
        for relay in self.relays:
            await relay.stop(2.0 if self.interrupted else 15.0)

    async def _counts(self) -> tuple[shop.ShopCounts, int]:
        """The shop's counts, and the outbox's backlog (records not yet published)."""
        counts = await self.orders.run_transaction(self.shop.counts)
        return counts, sum(partition.pending for partition in await self.outbox.backlog())

    async def _latencies(self, limit: int | None = None) -> tuple[list[float], list[float]]:
        return await self.orders.run_transaction(lambda tx: self.shop.latencies(tx, limit))

    def _metric(self, name: str, **labels: str) -> int:
        """``outboxkit_inbox_<name>_total`` of both services' inboxes."""
        wanted = f"outboxkit_inbox_{name}_total"
        return int(
            sum(
                sample.value
                for service in (self.payments, self.orders)
                for metric in service.registry.collect()
                for sample in metric.samples
                if sample.name == wanted and labels.items() <= sample.labels.items()
            )
        )

    async def _summary(self) -> DemoSummary:
        counts, _ = await self._counts()
        latency, round_trip = await self._latencies()
        o, reader = self.options, self.reader
        return DemoSummary(
            database=self.database.kind,
            broker=o.broker,
            transactional=o.transactional,
            orders=counts.orders,
            events_written=counts.written,
            events_published=reader.records,
            duplicates_published=reader.records - len(reader.event_ids),
            events_handled=counts.handled,
            duplicates_absorbed=self._metric("duplicates"),
            dead_lettered=self._metric("dead_lettered"),
            lost=counts.written - counts.handled,
            key_order_violations=len(reader.key_order.violations),
            latency_ms=Latency.of_seconds(latency),
            round_trip_ms=Latency.of_seconds(round_trip),
            relay_kills=sum(r.killed for r in self.relays),
            takeover_seconds=[round(t, 1) for t in self.takeovers],
            seconds=round(time.monotonic() - self.started, 1),
            pids=self.pids,
            workdir=str(self.workdir),
            note=None if o.transactional else UNFENCED_NOTE,
        )

    def _event(self, message: str) -> None:
        self.console.print(f"[dim]{time.monotonic() - self.started:6.1f} s[/]  {message}")
