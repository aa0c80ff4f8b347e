"""A steady load through relays and inbox workers, faults injected by the caller, and the
checks afterwards.

::

    async with FailoverRun(db_url, cluster.bootstrap_servers, tmp_path) as run:
        async with run.fault("leader kill") as fault:
            node = cluster.node(await run.topology.partition_leader(run.topic, run.busiest()))
            fault.detail = f"SIGKILL node {node.node_id}"
            await asyncio.to_thread(node.kill)
            ...
        report = await run.finish()
    print(report)
    report.assert_ok(max_gap=30)

Writers commit ``Payment`` events (the inbox test app's handler writes one ``effects`` row per
event, with its time) at about ``rate`` per second on ``entities`` keys; ``relays`` relay
processes (one group) publish them to a topic of ``partitions`` partitions (replication factor
3 when the cluster has 3 brokers), ``inboxes`` inbox worker processes (one group) take their
effects. Every process serves ``/healthz``. Leaving ``fault()``, the run waits until everything
committed so far has reached Kafka and taken effect (the fault's recovery), so faults in
sequence each start from a steady state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from uuid import UUID

import httpx
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from outboxkit.backends import backend_for
from outboxkit.core.kafka import admin_client
from outboxkit.core.settings import ConnectionSettings, KafkaConnectionSettings
from outboxkit.embedded._process import free_port
from outboxkit.embedded.kafka_topology import KafkaTopology
from outboxkit.relay.blocks import plan
from outboxkit.relay.ownership import describe_group
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.storage import OutboxStorage
from tests.failover.arrivals import ArrivalRecorder
from tests.failover.baseline import (
    FLOOR,
    QUIET_FLOOR,
    QUIET_RATE,
    WINDOW,
    Timeline,
    closest,
    first_back,
    measure,
)
from tests.failover.publishers import check_one_publisher, producer_sessions
from tests.failover.report import BEFORE, Fault, Load, Report, gaps
from tests.failover.worker_logs import excerpts
from tests.helpers import http_client, wait_for
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    InboxTables,
    create_effects_table,
    group_of,
    inbox_env,
    wait_caught_up,
)
from tests.integration.relay_harness import (
    RelayProcess,
    Writers,
    check_guarantees,
    read_topic,
    register_topic,
    relay_env,
)

#: Seconds a fault waits, at most, for a steady load before it begins (its baseline).
STEADY_WITHIN = 20.0

#: Seconds after a fault's heal within which a window must be as fast as before the fault,
#: unless the fault states its own bound: two session timeouts (a member that must rejoin), a
#: sweep, a window and the noise of a loaded 2-core machine.
BACK_WITHIN = 15.0


@dataclass
class Worker:
    """A relay or inbox process and the port of its ``/healthz``."""

    name: str
    process: RelayProcess | InboxProcess
    port: int

    def alive(self) -> bool:
        popen = self.process.process
        return popen is not None and popen.poll() is None

    async def healthy(self) -> bool:
        try:
            async with http_client() as http:
                response = await http.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
                return response.status_code == 200
        except (httpx.HTTPError, OSError):
            return False


@dataclass
class FailoverRun:
    url: str
    bootstrap: str
    log_dir: Path
    partitions: int = 6
    relays: int = 3
    inboxes: int = 2
    rate: float = 200.0
    entities: int = 24
    #: Concurrent writer transactions: at least ``rate`` times a transaction's time (a majority
    #: commit on a 3-member replica set takes several times PostgreSQL's local one).
    concurrent_writers: int = 4
    #: Seconds a fault may take to recover (everything committed has reached Kafka and taken
    #: effect) before the run fails with what is missing.
    recovery_timeout: float = 90.0
    topic: str = field(default_factory=lambda: f"failover-{uuid.uuid4().hex[:8]}")
    #: Name the relays so that their group and the inbox's have the same coordinator (the
    #: same partition of ``__consumer_offsets``): one broker kill then takes both groups'
    #: coordinator at once, as happens in production whenever they share one.
    shared_coordinator: bool = True
    faults: list[Fault] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    #: Environment of one worker over the others', by name (``relay-0``, ``inbox-1``): e.g. its
    #: Kafka bootstrap or database URL through a proxy (tests/network).
    worker_env: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Partition → its replicas' node ids, the first its leader: where the topic's leaders
    #: are (None: where Kafka puts them).
    replica_assignment: dict[int, list[int]] | None = None

    def __post_init__(self) -> None:
        self.relay_env = relay_env(self.url, self.bootstrap, self.topic)
        if self.shared_coordinator:
            self.relay_env["OUTBOXKIT_RELAY_NAME"] = _relay_name_beside(self.inbox_group)
        self.writers = Writers(self.url, self.topic, entities=self.entities, kind=Payment)
        self.arrivals = ArrivalRecorder(self.bootstrap, self.topic, self.partitions)
        self.topology = KafkaTopology(self.bootstrap)
        self._exit = contextlib.AsyncExitStack()
        self._writing = False
        #: When the writers took their current pace (a baseline window must be all at one).
        self._paced_since = 0.0
        #: The last fault, until its delays are back or its bound passed.
        self._unchecked: Fault | None = None
        self._effects: InboxTables | None = None
        self._outbox: OutboxStorage | None = None

    @property
    def relay_group(self) -> str:
        return f"outboxkit.relay.{self.relay_env['OUTBOXKIT_RELAY_NAME']}"

    @property
    def inbox_group(self) -> str:
        return group_of(self.topic)

    # -- start and stop ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def _start(self) -> None:
        await self._exit.enter_async_context(self.topology)
        # One client for every read of the run, polls included: pymongo's async client, closed
        # while its monitors still connect (as a client made for one query is), leaks their
        # sockets (PYTHON-5867); a client per 0.25 s poll through a failover did, and the leak
        # check failed the test.
        self._effects = await self._exit.enter_async_context(InboxTables(self.url))
        settings = ConnectionSettings(database_url=self.url)
        self._outbox = await self._exit.enter_async_context(
            backend_for(self.url).outbox_storage(settings)
        )
        brokers = len(self.bootstrap.split(","))
        replicas = min(3, brokers)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            placed = self.replica_assignment
            await admin.create_topics(
                [
                    NewTopic(self.topic, self.partitions, replicas)
                    if placed is None
                    else NewTopic(self.topic, -1, -1, replica_assignments=placed),
                    NewTopic(f"{self.topic}.dlq", 1, replicas),  # the inbox wants its DLQ
                ]
            )
        finally:
            await admin.close()
        await create_effects_table(self.url)
        await register_topic(self.url, self.topic, self.partitions)
        await self.arrivals.start()
        for i in range(self.relays):
            self._spawn(f"relay-{i}", RelayProcess, self.relay_env)
        for i in range(self.inboxes):
            self._spawn(f"inbox-{i}", InboxProcess, inbox_env(self.url, self.bootstrap, self.topic))
        self.writers.start(writers=self.concurrent_writers, rate=self.rate)
        self._writing = True
        # Steady: every partition published and effects taken.
        await wait_for(
            lambda: len(self.arrivals.per_partition) == self.partitions,
            within=90,
            interval=0.2,
            what="every partition to receive events",
        )
        await self._caught_up_to(time.time(), within=90)

    def _spawn(
        self, name: str, kind: type[RelayProcess] | type[InboxProcess], env: dict[str, str]
    ) -> None:
        port = free_port()
        env = {**env, **self.worker_env.get(name, {}), "OUTBOXKIT_HTTP_PORT": str(port)}
        process = kind(self.log_dir, env).start()
        self.workers.append(Worker(name, process, port))

    async def close(self) -> None:
        """Stops everything (idempotent): writers, processes, the arrival reader. The processes
        are killed whatever else fails (a writer's error, a timeout cancelling this): left
        running, they would keep retrying against servers the test has stopped, on the CPU of
        every later test of the run."""
        try:
            if self._writing:
                self._writing = False
                await self.writers.stop()
        finally:
            for worker in self.workers:
                worker.process.kill()
            try:
                await self.arrivals.stop()
            finally:
                await self._exit.aclose()

    # -- faults -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def fault(
        self, name: str, *, load: Load = "busy", back_within: float | None = BACK_WITHIN
    ) -> AsyncIterator[Fault]:
        """Marks a fault: inject it (and bring the server back) inside the block, and set
        ``fault.healed`` when it is back (else the block's end counts). Leaving it, waits until
        everything committed so far has reached Kafka and taken effect. Then the delays must be
        back to the window before the fault (:mod:`tests.failover.baseline`) within
        ``back_within`` seconds of the heal (None: not measured); the wait for that comes at
        the next fault or at :meth:`finish`, whichever is first, so that what the test does
        meanwhile overlaps it. With ``load="quiet"`` the writers slow to :data:`QUIET_RATE`
        for the fault, from one window before it, until its delays are back."""
        await self._check_back()
        rate = QUIET_RATE if load == "quiet" else self.rate
        if self.writers.rate != rate:
            self.writers.rate, self._paced_since = rate, time.time()
        # A baseline window all at this fault's load, the last commits of another settled.
        await asyncio.sleep(max(0.0, self._paced_since + WINDOW + 1.0 - time.time()))
        await self._steady(load)
        fault = Fault(name, time.time(), load=load, back_within=back_within or 0.0)
        self.faults.append(fault)
        try:
            yield fault
            fault.ended = time.time()
            fault.healed = fault.healed or fault.ended
            await self._caught_up_to(fault.ended, within=self.recovery_timeout)
            fault.recovered = time.time()
            if back_within is not None:
                fault.baseline = measure(self._timeline(), fault.started - WINDOW, fault.started)
                self._unchecked = fault
                if load == "quiet":
                    await self._check_back()  # the quiet window is its own
        finally:
            if self.writers.rate != self.rate:
                self.writers.rate, self._paced_since = self.rate, time.time()

    async def _check_back(self) -> None:
        """The wait for the last fault's delays to be back (:meth:`_back_to_baseline`)."""
        fault, self._unchecked = self._unchecked, None
        if fault is not None:
            await self._back_to_baseline(fault)

    async def _steady(self, load: Load) -> None:
        """Until the last window's p99 is under the load's floor (a group still forming, a
        backlog still draining make a baseline of nothing), at most :data:`STEADY_WITHIN`."""

        def steady() -> bool:
            now = time.time()
            window = measure(self._timeline(), now - WINDOW, now)
            return window.events > 0 and window.delivery_p99 <= _floor(load)

        with contextlib.suppress(AssertionError):  # a machine this slow: the baseline says so
            await wait_for(steady, within=STEADY_WITHIN, interval=0.2, what="a steady load")

    async def _back_to_baseline(self, fault: Fault) -> None:
        """Until a window after the heal is as fast as the baseline, or the bound passed: the
        next fault must not begin before the window that shows it is whole. A window counts
        only once every event in it is on Kafka and has taken effect, and is judged with its
        effects (the inbox's delays): a window judged with events still in flight, which the
        next fault then delayed, was back here and not back in :meth:`finish`."""
        baseline = fault.baseline
        assert baseline is not None
        until = fault.healed + fault.back_within

        async def back() -> bool:
            now = time.time()
            timeline = self._timeline()
            whole_until = min(
                until, _first_commit_missing(timeline.committed_at, timeline.arrivals, now)
            )
            found = first_back(
                timeline, baseline, healed=fault.healed, until=whole_until, now=now, load=fault.load
            )
            if found is not None:
                # Now with its effects, every one of them in.
                await self._caught_up_to(found.start + WINDOW, within=self.recovery_timeout)
                effect_at = {e: min(times) for e, times in (await self.effect_times()).items()}
                timeline, now = self._timeline(effect_at), time.time()
                whole_until = min(
                    whole_until, _first_commit_missing(timeline.committed_at, effect_at, now)
                )
                found = first_back(
                    timeline,
                    baseline,
                    healed=fault.healed,
                    until=whole_until,
                    now=now,
                    load=fault.load,
                )
            return found is not None or now >= until + 1.0

        await wait_for(back, within=fault.back_within + 30, interval=0.2, what="back to baseline")

    def busiest(self) -> int:
        """The partition that received the most records so far."""
        return self.arrivals.busiest_partition()

    async def relay_transactional_id(self, partition: int) -> str:
        """The transactional id the relays publish ``partition`` with now (its owner's block
        that contains it, as ``outboxkit/relay/blocks.py`` plans them)."""
        settings = KafkaConnectionSettings(kafka_bootstrap_servers=self.bootstrap.split(","))
        wanted = TopicPartition(self.topic, partition)
        found: list[str] = []

        async def owned() -> bool:
            with contextlib.suppress(KafkaError):  # the coordinator is moving or loading
                async with admin_client(settings) as admin:
                    _, members = await describe_group(admin, self.relay_group)
                for member in members:
                    for block in plan(member.assigned, {self.topic: self.partitions}, max_level=5):
                        if wanted in block.partitions(self.partitions):
                            found.append(block.transactional_id(self.relay_group))
                            return True
            return False  # a rebalance is running

        await wait_for(owned, within=30, interval=0.5, what=f"a relay owning {wanted}")
        return found[0]

    async def settled(self) -> None:
        """Wait until everything committed so far has reached Kafka and taken effect (within
        ``recovery_timeout``)."""
        await self._caught_up_to(time.time(), within=self.recovery_timeout)

    async def _caught_up_to(self, moment: float, *, within: float) -> None:
        """Wait until every event committed by ``moment`` is on Kafka and has taken effect."""
        due = [e for e, at in list(self.writers.committed_at.items()) if at <= moment]
        arrived = self.arrivals.arrivals

        def on_kafka() -> bool:
            return all(e in arrived for e in due)

        async def effective() -> bool:
            return await self._tables().effect_count() >= len(due)

        try:
            await wait_for(on_kafka, within=within, interval=0.1, what="events reaching Kafka")
            await wait_for(effective, within=within, interval=0.25, what="the inbox's effects")
        except AssertionError as exc:
            missing = [e for e in due if e not in arrived]
            raise AssertionError(
                f"{exc}: {len(missing)} of {len(due)} committed events not on Kafka; "
                f"{await self._tables().effect_count()} effects. Logs in {self.log_dir}"
            ) from None

    # -- the checks -----------------------------------------------------------------------------

    async def finish(self) -> Report:
        """Stop writing, let everything drain, and check G1, G2, G4, G6, the processes' health
        and each fault's gaps."""
        await self._check_back()  # the writers still at it: the windows after the last heal
        self._writing = False
        await self.writers.stop()
        commits = sorted(self.writers.committed_at.values())
        load = len(commits) / (commits[-1] - commits[0]) if len(commits) > 1 else 0.0
        await wait_for(self._drained, within=90, interval=0.25, what="outbox drain")
        await self._caught_up_to(time.time(), within=90)
        await wait_caught_up(
            self.bootstrap,
            self.inbox_group,
            self.topic,
            self.partitions,
            within=60,
            what="the inbox's offsets to reach the end",
            interval=0.5,
        )
        report = Report(
            load=f"{len(commits)} events written, {load:.0f}/s (asked {self.rate:.0f}/s)"
        )
        report.health = await self._health()
        published = await read_topic(self.bootstrap, self.topic, self.partitions)
        report.guarantees["G1+G2"] = _outcome(lambda: check_guarantees(self.writers, published))
        sessions = await producer_sessions(
            self.topology, self.bootstrap, self.topic, self.partitions
        )
        offsets = self.arrivals.offsets
        report.guarantees["G4"] = _outcome(lambda: check_one_publisher(offsets, sessions))
        effects = await self.effect_times()
        distinct = {event_id for records in published.values() for _, event_id in records}
        report.guarantees["G6"] = _outcome(lambda: check_effects_once(effects, distinct))
        effect_at = {e: min(times) for e, times in effects.items()}
        arrivals = self.arrivals.arrivals
        for fault, later in zip(self.faults, [*self.faults[1:], None], strict=True):
            if fault.baseline is None:
                continue
            # The inbox's delays too, and only from windows before the next fault began.
            until = fault.healed + fault.back_within
            if later is not None:
                until = min(until, later.started - (WINDOW + 1.0 if later.load == "quiet" else 0))
            timeline = self._timeline(effect_at)
            fault.baseline = measure(timeline, fault.started - WINDOW, fault.started)
            now = time.time()
            fault.back = first_back(
                timeline, fault.baseline, healed=fault.healed, until=until, now=now, load=fault.load
            )
            if fault.back is None:
                fault.closest = closest(
                    timeline, fault.baseline, healed=fault.healed, until=until, now=now
                )
        logs = [(w.name, w.process.log()) for w in self.workers]
        report.faults = [
            gaps(
                f,
                self.writers.committed_at,
                arrivals,
                effect_at,
                logged=excerpts(logs, f.started, f.recovered or time.time(), before=BEFORE),
            )
            for f in self.faults
        ]
        return report

    def _timeline(self, effect_at: dict[UUID, float] | None = None) -> Timeline:
        return Timeline(self.writers.committed_at, self.arrivals.arrivals, effect_at)

    # -- the database -------------------------------------------------------------------------

    async def _drained(self) -> bool:
        assert self._outbox is not None, "the run has not started"
        return sum(b.pending for b in await self._outbox.backlog()) == 0

    def _tables(self) -> InboxTables:
        assert self._effects is not None, "the run has not started"
        return self._effects

    async def effect_times(self) -> dict[UUID, list[float]]:
        """Event id → when each of its effects was written (one, unless G6 broke)."""
        return await self._tables().effect_times()

    async def _health(self) -> list[str]:
        """Every process still the one started (none died), each ``/healthz`` 200 again within
        30 s, and no traceback in any log."""
        problems = [f"{w.name} exited" for w in self.workers if not w.alive()]

        async def all_healthy() -> bool:
            return all([await w.healthy() for w in self.workers if w.alive()])

        try:
            await wait_for(all_healthy, within=30, interval=0.5, what="healthy")
        except AssertionError:
            sick = [w.name for w in self.workers if w.alive() and not await w.healthy()]
            problems.append(f"/healthz not 200 after 30 s: {', '.join(sick)}")
        problems += [
            f"{w.name} logged a traceback ({w.process.log_path})"
            for w in self.workers
            if "Traceback" in w.process.log()
        ]
        return problems


def _floor(load: Load) -> float:
    return QUIET_FLOOR if load == "quiet" else FLOOR


def _offsets_partition(group: str, partitions: int = 10) -> int:
    """The ``__consumer_offsets`` partition of ``group``, as Kafka picks it: Java's
    ``String.hashCode`` of the name, made non-negative (``Utils.abs``), modulo the partitions
    (``offsets.topic.num.partitions``: 10 on the embedded cluster)."""
    h = 0
    for unit in group.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def _relay_name_beside(group: str) -> str:
    """A relay name whose group ``outboxkit.relay.<name>`` maps to ``group``'s partition."""
    target = _offsets_partition(group)
    while True:
        name = f"failover-{uuid.uuid4().hex[:8]}"
        if _offsets_partition(f"outboxkit.relay.{name}") == target:
            return name


def check_effects_once(effects: dict[UUID, list[float]], published: set[UUID]) -> str:
    """G6: each published event took effect exactly once, and nothing else did."""
    twice = [e for e, times in effects.items() if len(times) > 1]
    missing = published - effects.keys()
    extra = effects.keys() - published
    assert not twice, f"G6 violated: {len(twice)} events took effect more than once"
    assert not missing, f"G6 violated: {len(missing)} published events took no effect"
    assert not extra, f"G6 violated: {len(extra)} effects of events never published"
    return f"{len(effects)} events, one effect each"


def _outcome(check: Any) -> tuple[bool, str]:
    try:
        return True, str(check())
    except AssertionError as exc:
        return False, str(exc)


def _first_commit_missing(
    committed_at: Mapping[UUID, float], done: Mapping[UUID, object], now: float
) -> float:
    """When the earliest event not in ``done`` (on Kafka, or in effect) was committed; ``now``
    if every one is: the windows before it are whole."""
    return min((at for e, at in list(committed_at.items()) if e not in done), default=now)
