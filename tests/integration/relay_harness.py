"""Tools for the relay's guarantee tests: keyed writers, relay processes, and a reader that
checks what reached the topic against what was committed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from outboxkit.backends import backend_for
from outboxkit.core.settings import ConnectionSettings
from outboxkit.embedded._process import die_with_parent
from outboxkit.schemas import Event, EventRegistry
from tests.helpers import started_worker, wait_for
from tests.integration.step_writers import DatabaseAwayError, StepWriter, step_writer
from tests.timeouts import RELAY_ENV

registry = EventRegistry()


@registry.register
class Step(Event, type="test.step", key_field="entity"):
    """The ``seq``-th event of ``entity``; an entity's events are written in series."""

    entity: str
    seq: int


@registry.register
class Big(Event, type="test.big", key_field="entity"):
    """An event too large for Kafka's default 1 MiB limit."""

    entity: str
    blob: str


class RelayProcess:
    """``outboxkit relay`` in a subprocess, so a test can SIGKILL, SIGSTOP or SIGTERM it."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_path = log_dir / f"relay-{uuid.uuid4().hex[:6]}.log"
        self._env = {**os.environ, **RELAY_ENV, **env}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        with self.log_path.open("ab") as log:
            self.process = started_worker(
                subprocess.Popen(
                    [sys.executable, "-m", "outboxkit", "relay"],
                    env=self._env,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 - no leftovers if pytest dies
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        return self

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def relays(log_dir: Path, env: dict[str, str], count: int = 1) -> Iterator[list[RelayProcess]]:
    started = [RelayProcess(log_dir, env).start() for _ in range(count)]
    try:
        yield started
    finally:
        for relay in started:
            relay.kill()


def relay_env(url: str, bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOXKIT_TOPICS": topic,
        "OUTBOXKIT_RELAY_NAME": f"test-{uuid.uuid4().hex[:8]}",
        **extra,
    }


async def register_topic(url: str, topic: str, partitions: int) -> None:
    """What the relay does at start; lets writers begin before any relay runs."""
    settings = ConnectionSettings(database_url=url)
    async with backend_for(url).outbox_storage(settings) as storage:
        await storage.register_topics({topic: partitions})


async def wait_pending(
    url: str,
    until: Callable[[int], bool] = lambda pending: pending == 0,
    *,
    within: float,
    what: str = "the outbox to drain",
) -> None:
    """Wait until ``until`` holds for the number of records the relay has not published yet
    (by default: until none is left), on any backend. One storage reads the backlog for the
    whole wait: a storage per 20 ms poll cost the test process 6 (PostgreSQL) to 11 (MongoDB)
    ms of CPU each, beside the relays it waits on, and a MongoDB client closed at once may leak
    a socket (tests/README.md)."""
    settings = ConnectionSettings(database_url=url)
    async with backend_for(url).outbox_storage(settings) as storage:

        async def holds() -> bool:
            return until(sum(b.pending for b in await storage.backlog()))

        await wait_for(holds, within=within, what=what)


@dataclass
class Writers:
    """Writes ``entities`` entities' events in series, each event with a business row in the
    same transaction. ``committed[entity]`` lists the event ids known committed, in order;
    ``committed_at`` when each commit returned (wall clock). ``kind`` is the event class: any
    with ``entity`` and ``seq`` fields (the inbox tests' ``Payment`` has a handler)."""

    url: str
    topic: str
    entities: int = 8
    kind: Callable[..., Event] = Step
    committed: dict[str, list[UUID]] = field(default_factory=lambda: defaultdict(list))
    seq_of: dict[UUID, tuple[str, int]] = field(default_factory=dict)
    committed_at: dict[UUID, float] = field(default_factory=dict)
    #: Events per second over all writers (None: as fast as ``pause`` allows). May be changed
    #: while they write: each writer's next write starts at the new pace.
    rate: float | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _writers: int = 0

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.committed.values())

    def start(self, *, writers: int = 4, pause: float = 0.002, rate: float | None = None) -> None:
        """``writers`` tasks, each pausing ``pause`` after each commit; or, with ``rate``,
        starting its writes ``writers / rate`` apart (a slow commit is not added to the pause:
        a database whose transactions take longer still gets about ``rate``, given writers
        enough)."""
        names = [f"entity-{i}" for i in range(self.entities)]
        self.rate, self._writers = rate, writers
        for w in range(writers):
            mine = names[w::writers]
            self._tasks.append(asyncio.create_task(self._write(mine, pause)))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _write(self, entities: list[str], pause: float) -> None:
        writer = step_writer(self.url)
        seqs = dict.fromkeys(entities, 0)
        turn = 0
        next_start = time.monotonic()
        pace = self.rate
        try:
            while not self._stop.is_set():
                if self.rate != pace:  # a new pace from now on, not a catch-up of the old one
                    next_start, pace = time.monotonic(), self.rate
                interval = self._writers / pace if pace else None
                next_start += interval or 0.0
                entity = entities[turn % len(entities)]
                turn += 1
                event = self.kind(topic=self.topic, entity=entity, seq=seqs[entity])
                try:
                    await writer.write(event)
                except DatabaseAwayError:
                    # The database went away mid-transaction: did the commit happen? Ask again
                    # once it is back; the business row tells.
                    if not await self._committed_after_all(writer, event.id):
                        continue  # the database answered: not committed, write it again
                self.committed_at[event.id] = time.time()
                self.committed[entity].append(event.id)
                self.seq_of[event.id] = (entity, seqs[entity])
                seqs[entity] += 1
                await asyncio.sleep(pause if interval is None else next_start - time.monotonic())
        finally:
            await writer.close()

    async def _committed_after_all(self, writer: StepWriter, event_id: UUID) -> bool:
        while not self._stop.is_set():
            committed = await writer.committed(event_id)
            if committed is not None:
                return committed
            # Still away: try again shortly, or give up at once when the writers stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)
        return False


async def read_topic(
    bootstrap: str, topic: str, partitions: int
) -> dict[int, list[tuple[bytes, UUID]]]:
    """Everything committed on ``topic`` so far (read_committed), per partition in offset order:
    (key, event id)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        assigned = [KafkaTP(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        end = await consumer.end_offsets(assigned)
        result: dict[int, list[tuple[bytes, UUID]]] = {tp.partition: [] for tp in assigned}
        async with asyncio.timeout(60):
            while [tp for tp in assigned if await consumer.position(tp) < end[tp]]:
                batches = await consumer.getmany(*assigned, timeout_ms=500)
                for tp, records in batches.items():
                    for record in records:
                        event_id = UUID(dict(record.headers)["ce_id"].decode())
                        result[tp.partition].append((record.key or b"", event_id))
        return result
    finally:
        await consumer.stop()


def check_guarantees(writers: Writers, published: dict[int, list[tuple[bytes, UUID]]]) -> str:
    """G1: every committed event is on the topic. G2: per entity, the sequence numbers on the
    topic never go down (a re-delivery repeats only the latest in-flight event). Returns a short
    summary; raises AssertionError with the first violation."""
    per_entity: dict[str, list[int]] = defaultdict(list)
    seen: set[UUID] = set()
    duplicates = 0
    for records in published.values():
        for _key, event_id in records:
            if event_id in seen:
                duplicates += 1
            seen.add(event_id)
            if event_id in writers.seq_of:
                entity, seq = writers.seq_of[event_id]
                per_entity[entity].append(seq)
    missing = [
        (entity, i)
        for entity, ids in writers.committed.items()
        for i, event_id in enumerate(ids)
        if event_id not in seen
    ]
    assert not missing, f"G1 violated: {len(missing)} committed events missing, e.g. {missing[:5]}"
    for entity, seqs in per_entity.items():
        for i, (before, after) in enumerate(itertools.pairwise(seqs)):
            assert after >= before, (
                f"G2 violated for {entity}: seq {after} published after {before}: "
                f"…{seqs[max(0, i - 3) : i + 5]}…"
            )
    return f"{writers.total} committed, {len(seen)} distinct published, {duplicates} duplicates"
