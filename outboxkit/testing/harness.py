"""What a service's tests do with outboxkit, on any backend: write events in a transaction, run
the relay until the outbox is empty, read back what was published, and run a handler through
an inbox store (dedupe included) — against real servers, or all in memory.

:class:`OutboxkitHarness` is what the ``outboxkit`` and ``outboxkit_memory`` fixtures give
(:mod:`outboxkit.testing`). With a ``memory://`` database and no broker, "publishing" moves the
committed records of the in-memory outbox to an in-memory log that :meth:`published` reads, so a
unit test of a writer reads exactly like an integration test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata
from aiokafka.structs import TopicPartition as KafkaTP
from prometheus_client import CollectorRegistry

from outboxkit.backends import Backend, Transactions, backend_for, memory_database
from outboxkit.core import kafka_clients
from outboxkit.core.kafka import TopicSpec, ensure_topics, partition_counts
from outboxkit.core.settings import ConnectionSettings, KafkaConnectionSettings, open_broker
from outboxkit.inbox import Inbox, InboxMetrics, InboxSettings, InboxWorker
from outboxkit.inbox.store import Delivery
from outboxkit.relay import OutboxRecord, OutboxWriter, Relay, RelayMetrics, RelaySettings
from outboxkit.schemas import Event, EventRegistry, encode

E = TypeVar("E", bound=Event)

#: Group timings that make a test's relay or inbox join and leave in about a second.
FAST_GROUP: dict[str, Any] = {"session_timeout": 3.0, "heartbeat_interval": 0.5}


@dataclass(frozen=True)
class Broker:
    """A Kafka-protocol broker for tests. ``transactions``: false for Tansu (no transactions
    nor idempotent producers), whose relays then publish without fencing."""

    bootstrap_servers: str
    transactions: bool = True

    def __str__(self) -> str:
        return self.bootstrap_servers


@dataclass
class _Published:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


@dataclass
class OutboxkitHarness:
    """Helpers over one database (``postgresql://``, ``mongodb://`` or ``memory://``) and, for
    the real thing, one broker. Close it with ``async with`` (the fixtures do)."""

    database_url: str
    broker: Broker | None = None
    source: str = "urn:outboxkit:tests"
    #: Where published() starts per topic-partition (the end when the topic was created here).
    _start: dict[KafkaTP, int] = field(default_factory=dict)
    #: memory:// without a broker: what "publishing" moved out of the outbox.
    _memory_log: list[_Published] = field(default_factory=list)
    _stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    _transactions: Transactions | None = None

    async def __aenter__(self) -> OutboxkitHarness:
        self._transactions = await self._stack.enter_async_context(
            self.backend.transactions(source=self.source, pool_size=4, connect_timeout=10.0)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def backend(self) -> Backend:
        return backend_for(self.database_url)

    def settings(self, topics: Iterable[str] = ()) -> dict[str, Any]:
        """Keyword arguments for any outboxkit settings object (relay, inbox, service)."""
        values: dict[str, Any] = {"database_url": self.database_url, "topics": list(topics)}
        if self.broker is not None:
            values["kafka_bootstrap_servers"] = self.broker.bootstrap_servers
        return values

    @property
    def _kafka(self) -> KafkaConnectionSettings:
        assert self.broker is not None
        return open_broker([self.broker.bootstrap_servers])

    def environment(self) -> dict[str, str]:
        """The ``OUTBOXKIT_*`` variables of this harness, for code that reads the environment
        (an ``Outboxkit`` service, a subprocess): ``monkeypatch.setenv`` each of them."""
        env = {"OUTBOXKIT_DATABASE_URL": self.database_url}
        if self.broker is not None:
            env["OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS"] = self.broker.bootstrap_servers
            env["OUTBOXKIT_SESSION_TIMEOUT"] = str(FAST_GROUP["session_timeout"])
            env["OUTBOXKIT_HEARTBEAT_INTERVAL"] = str(FAST_GROUP["heartbeat_interval"])
            if not self.broker.transactions:
                env["OUTBOXKIT_TRANSACTIONAL"] = "false"
                env["OUTBOXKIT_DLQ_IDEMPOTENCE"] = "false"
        return env

    # -- topics --------------------------------------------------------------------------------

    async def create_topics(self, *topics: str, partitions: int = 3) -> None:
        """Create ``topics`` and their dead-letter topics on the broker if they do not exist,
        register their partition counts for writers, and start :meth:`published` at their
        current end (so a test sees only its own events on a topic an earlier test used)."""
        if self.broker is None:
            counts = dict.fromkeys(topics, partitions)
        else:
            specs = [TopicSpec(t, partitions, 1) for t in topics]
            specs += [TopicSpec(f"{t}.dlq", partitions, 1) for t in topics]
            await ensure_topics(self._kafka, specs)
            counts = await partition_counts(self._kafka, list(topics))
            self._start.update(await self._end_offsets(list(topics)))
        settings = ConnectionSettings(**self.settings(topics))
        async with self.backend.outbox_storage(settings) as storage:
            await storage.register_topics(counts)

    # -- writing -------------------------------------------------------------------------------

    @property
    def _opened(self) -> Transactions:
        if self._transactions is None:
            raise RuntimeError("open the harness first: async with OutboxkitHarness(…) as h")
        return self._transactions

    @property
    def outbox(self) -> OutboxWriter[Any]:
        """The backend's outbox writer (``await h.outbox.add(tx, event)`` inside
        :meth:`transaction`), with source :attr:`source`."""
        return self._opened.outbox

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A transaction of the backend (a psycopg connection, a MongoDB session, or an
        in-memory transaction) that commits when the block ends without an exception."""
        return self._opened.transaction()

    async def add(self, *events: Event) -> None:
        """Add ``events`` to the outbox in one transaction of their own."""
        async with self.transaction() as tx:
            await self.outbox.add_many(tx, events)

    # -- the relay -----------------------------------------------------------------------------

    async def run_relay_until_empty(self, *, within: float = 60.0) -> None:
        """Run a relay until nothing is pending in the outbox (records the broker refused are
        parked as failed and do not count), then stop it. Raises ``TimeoutError`` after
        ``within`` seconds, or what the relay died of."""
        settings = ConnectionSettings(**self.settings())
        async with self.backend.outbox_storage(settings) as storage:
            backlog = await storage.backlog()
        topics = sorted({b.topic for b in backlog if b.pending})
        if not topics:
            return
        if self.broker is None:
            await self._relay_in_memory()
            return
        relay_settings = RelaySettings(
            **self.settings(topics),
            relay_name=f"testing-{uuid.uuid4().hex[:8]}",
            transactional=self.broker.transactions,
            sweep_interval=0.5,
            **FAST_GROUP,
        )
        async with self.backend.relay(relay_settings) as (storage, wakeups):
            relay = Relay(
                relay_settings, storage, wakeups, metrics=RelayMetrics(CollectorRegistry())
            )
            task = asyncio.create_task(relay.run(), name="outboxkit.testing relay")
            try:
                await _until(lambda: _outbox_empty(storage), within, task, "the outbox empty")
            finally:
                relay.stop()
                await asyncio.gather(task, return_exceptions=True)

    async def _relay_in_memory(self) -> None:
        outbox = memory_database(self.database_url).outbox
        pending = [record for record, state in outbox.rows if state == "pending"]
        for record in pending:
            self._memory_log.append(_published(record))
        await outbox.settle_and_claim((), 0, published=pending, keep=False)

    # -- reading back --------------------------------------------------------------------------

    async def published(self, *event_types: type[E], topics: Sequence[str] = ()) -> list[E]:
        """The events of ``event_types`` published to their topics (or ``topics``) since
        :meth:`create_topics`, in partition and offset order (per-key order is kept)."""
        registry = EventRegistry()
        for event_type in event_types:
            registry.register(event_type)
        wanted = list(topics) or sorted({t.event_topic for t in event_types if t.event_topic})
        records = (
            [r for r in self._memory_log if r.topic in wanted]
            if self.broker is None
            else await self._read(wanted)
        )
        events: list[E] = []
        for record in records:
            event = registry.decode(
                topic=record.topic, key=record.key, value=record.value, headers=record.headers
            )
            if isinstance(event, event_types):
                events.append(event)
        return events

    async def _end_offsets(self, topics: list[str]) -> dict[KafkaTP, int]:
        assert self.broker is not None
        if not topics:
            return {}
        counts = await partition_counts(self._kafka, topics)
        partitions = [KafkaTP(t, p) for t, n in counts.items() for p in range(n)]
        consumer = kafka_clients.consumer(self._kafka, isolation_level="read_committed")
        await consumer.start()
        try:
            return dict(await consumer.end_offsets(partitions))
        finally:
            await consumer.stop()

    async def _read(self, topics: list[str]) -> list[_Published]:
        assert self.broker is not None
        ends = await self._end_offsets(topics)
        wanted = {tp: end for tp, end in ends.items() if end > self._start.get(tp, 0)}
        if not wanted:
            return []
        consumer = kafka_clients.consumer(
            self._kafka, isolation_level="read_committed", enable_auto_commit=False
        )
        await consumer.start()
        found: list[_Published] = []
        try:
            consumer.assign(list(wanted))
            for tp in wanted:
                consumer.seek(tp, self._start.get(tp, 0))
            deadline = time.monotonic() + 30
            while [tp for tp, end in wanted.items() if await consumer.position(tp) < end]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {', '.join(topics)} took more than 30 s")
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    found.extend(
                        _Published(r.topic, r.partition, r.offset, r.key, r.value, r.headers)
                        for r in records
                        if r.offset < wanted[KafkaTP(r.topic, r.partition)]
                    )
        finally:
            await consumer.stop()
        return sorted(found, key=lambda r: (r.topic, r.partition, r.offset))

    # -- the inbox -----------------------------------------------------------------------------

    async def deliver(self, inbox: Inbox[Any], *events: Event) -> list[bool]:
        """Take ``events`` into effect through ``inbox``'s handlers as the inbox worker does:
        through the wire format (encoded, then decoded by the inbox's registry), as one batch of
        the backend's inbox store, which records each id in the transaction of its handler (a
        batch handler gets a run of its type's events in one call). Returns, per event, whether
        its handler ran (``False``: a duplicate, absorbed); a handler's exception is raised: the
        events before it took effect, its own effects were rolled back, the rest did not run."""
        settings = InboxSettings(
            **self.settings(inbox.topics or ["-"]), **_inbox_broker(self.broker)
        )
        deliveries = []
        for offset, event in enumerate(events):
            wire = encode(event, source=self.source)
            decoded = inbox.registry.decode(
                topic=wire.topic, key=wire.key, value=wire.value, headers=wire.headers
            )
            handler = inbox.handler_for(decoded)
            if handler is None:
                raise LookupError(f"inbox {inbox.name} has no handler for {type(event)}")
            batch = inbox.batch_handler_for(decoded)
            deliveries.append(Delivery(decoded, handler, wire.topic, 0, offset, batch=batch))
        ran: list[bool] = []
        async with self.backend.inbox_store(settings) as store:
            while len(ran) < len(deliveries):  # a store may commit a batch in parts
                outcome = await store.process_batch(inbox.name, deliveries[len(ran) :])
                ran.extend(outcome.ran)
                if outcome.failed is not None:
                    raise outcome.failed[1]
        return ran

    async def run_inbox_until_idle(self, inbox: Inbox[Any], *, within: float = 60.0) -> None:
        """Run an inbox worker for ``inbox`` until it has committed everything published to its
        topics since :meth:`create_topics` (handled, absorbed or dead-lettered), then stop it.
        What earlier tests published there is skipped: the inbox's group starts where
        :meth:`create_topics` found the topics' end."""
        if self.broker is None:
            raise RuntimeError("run_inbox_until_idle needs a broker; in memory, use deliver()")
        settings = InboxSettings(
            **self.settings(inbox.topics), **_inbox_broker(self.broker), **FAST_GROUP
        )
        group = f"outboxkit.inbox.{inbox.name}"
        # Where the inbox must have committed: after the last record on each partition (not
        # the end offset, which a transaction's commit marker puts one further).
        ends: dict[KafkaTP, int] = {}
        for record in await self._read(list(inbox.topics)):
            ends[KafkaTP(record.topic, record.partition)] = record.offset + 1
        async with self._group_offsets(group, [*self._start, *ends]) as committed:
            behind = {
                tp: OffsetAndMetadata(start, "")
                for tp, start in self._start.items()
                if tp.topic in inbox.topics and start > (await committed(tp))
            }
            if behind:  # what earlier tests published there: not this test's business
                await committed.consumer.commit(behind)  # the group has no member right now

            async def done() -> bool:
                return all([await committed(tp) >= end for tp, end in ends.items()])

            async with self.backend.inbox_store(settings) as store:
                worker = InboxWorker(
                    inbox, settings, store, metrics=InboxMetrics(CollectorRegistry())
                )
                task = asyncio.create_task(worker.run(), name="outboxkit.testing inbox")
                try:
                    await _until(done, within, task, f"inbox {inbox.name} idle")
                finally:
                    worker.stop()
                    await asyncio.gather(task, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def _group_offsets(
        self, group: str, partitions: Sequence[KafkaTP]
    ) -> AsyncIterator[_Committed]:
        """The offsets ``group`` committed (0 where none), read by a consumer that never joins
        the group (it only fetches offsets)."""
        assert self.broker is not None
        consumer = kafka_clients.consumer(self._kafka, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(dict.fromkeys(partitions)))
            yield _Committed(consumer)
        finally:
            await consumer.stop()


@dataclass
class _Committed:
    consumer: AIOKafkaConsumer

    async def __call__(self, tp: KafkaTP) -> int:
        offset = await self.consumer.committed(tp)
        return offset if offset is not None and offset >= 0 else 0


def _inbox_broker(broker: Broker | None) -> dict[str, Any]:
    return {"dlq_idempotence": False} if broker is not None and not broker.transactions else {}


def _published(record: OutboxRecord) -> _Published:
    return _Published(record.topic, record.partition, 0, record.key, record.value, record.headers)


async def _outbox_empty(storage: Any) -> bool:
    return not any(b.pending for b in await storage.backlog())


async def _until(condition: Any, within: float, task: asyncio.Task[None], what: str) -> None:
    """Wait for ``condition()`` while ``task`` runs; raise what the task died of."""
    deadline = time.monotonic() + within
    while not await condition():
        if task.done():
            task.result()
            raise RuntimeError(f"the {task.get_name()} stopped before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {within:.0f} s for {what}")
        await asyncio.sleep(0.1)
