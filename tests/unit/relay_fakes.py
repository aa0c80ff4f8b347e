"""Fakes that drive the relay engine without Kafka or a database.

- :class:`FakeBroker` hands out :class:`FakePublisher` s (``publisher_factory=broker.factory``,
  one per block of partitions), keeps what reached each partition, records the transactional ids
  fenced (``fencer_factory=broker.fencer``), and injects failures: retriable errors (before or
  after the records became visible), rejected records, fencing, a gate that holds publishes in
  flight. Failures and lookups are by partition: they apply to the block that holds it.
- :class:`ManualOwnership` is the ``ownership_factory``: the test assigns and revokes.
- :class:`SpyStorage` is the in-memory outbox with a record of the engine's calls and a few
  injectable storage failures.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, cast
from uuid import UUID

from aiokafka.errors import KafkaConnectionError

from outboxkit.relay.blocks import Block
from outboxkit.relay.exceptions import OwnershipLostError, StorageUnavailableError
from outboxkit.relay.memory import InMemoryOutboxStorage
from outboxkit.relay.ownership import PartitionsCallback
from outboxkit.relay.publisher import StageTimes
from outboxkit.relay.records import OutboxRecord, PublishOutcome, TopicPartition
from outboxkit.relay.settings import RelaySettings

#: What one publish call does instead of succeeding:
#: ``error``     KafkaConnectionError, nothing reached the topic;
#: ``lost_ack``  the records reached the topic, then KafkaConnectionError (the ack was lost);
#: ``fenced``    OwnershipLostError, nothing reached the topic;
#: ``crash``     RuntimeError, an error the engine does not expect;
#: ``hang``      no answer, ever (until cancelled).
Failure = Literal["error", "lost_ack", "fenced", "crash", "hang"]

REJECTION = "MessageSizeTooLargeError: the message is larger than the broker accepts"


@dataclass(frozen=True)
class PublishCall:
    block: Block
    ids: list[int]
    publisher: FakePublisher
    at: float
    tps: frozenset[TopicPartition] = field(default_factory=frozenset)


class FakeBroker:
    """Shared by every publisher of one test: the topic's contents and the failures to inject."""

    def __init__(self) -> None:
        self.topic: dict[TopicPartition, list[OutboxRecord]] = defaultdict(list)
        self.publishers: list[FakePublisher] = []
        self.calls: list[PublishCall] = []
        #: Failures of the next publish calls, whatever their partition (None: succeed).
        self.script: deque[Failure | None] = deque()
        #: Every publish call to that partition fails so.
        self.always: dict[TopicPartition, Failure] = {}
        #: Raised by the next ``start()`` calls of a partition's publishers.
        self.start_failures: dict[TopicPartition, deque[BaseException]] = defaultdict(deque)
        #: Event id → how many more times the broker rejects it (None: forever).
        self.reject: dict[UUID, int | None] = {}
        #: Event id → when it was rejected (monotonic).
        self.rejections: dict[UUID, list[float]] = defaultdict(list)
        #: Publishes wait for this gate: ``block()`` holds them in flight.
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = 0
        self.max_in_flight = 0
        #: Misuses of the Publisher protocol by the engine (should stay empty).
        self.violations: list[str] = []
        #: Transactional ids initialised by the relay's fencer, in order.
        self.fenced_ids: list[str] = []
        #: Called with each batch as it is published; returns the violations it finds.
        self.inspect: Callable[[Sequence[OutboxRecord]], list[str]] | None = None

    def factory(self, block: Block) -> FakePublisher:
        publisher = FakePublisher(self, block)
        self.publishers.append(publisher)
        return publisher

    def fencer(self, settings: RelaySettings) -> FakeFencer:
        return FakeFencer(self)

    def block(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def ids(self, tp: TopicPartition | None = None) -> list[int]:
        """Ids that reached ``tp`` (or any partition), in topic order, repeats included."""
        parts = [tp] if tp is not None else sorted(self.topic, key=lambda p: p.partition)
        return [cast(int, r.id) for p in parts for r in self.topic.get(p, [])]

    def ids_by_key(self) -> dict[bytes, list[int]]:
        by_key: dict[bytes, list[int]] = defaultdict(list)
        for records in self.topic.values():
            for record in records:
                by_key[record.key].append(cast(int, record.id))
        return dict(by_key)

    def calls_to(self, tp: TopicPartition) -> list[PublishCall]:
        """Publish calls through a block that holds ``tp``."""
        return [c for c in self.calls if _holds(c.block, tp)]

    def publishers_of(self, tp: TopicPartition) -> list[FakePublisher]:
        """Publishers of blocks that hold ``tp``."""
        return [p for p in self.publishers if _holds(p.block, tp)]

    def _failure(self, block: Block) -> Failure | None:
        for tp, failure in self.always.items():
            if _holds(block, tp):
                return failure
        return self.script.popleft() if self.script else None

    def _rejects(self, record: OutboxRecord) -> bool:
        if record.event_id not in self.reject:
            return False
        left = self.reject[record.event_id]
        return left is None or left > 0

    def _count_rejection(self, record: OutboxRecord) -> None:
        left = self.reject[record.event_id]
        if left is not None:
            self.reject[record.event_id] = left - 1
        self.rejections[record.event_id].append(time.monotonic())


def _holds(block: Block, tp: TopicPartition) -> bool:
    return block.topic == tp.topic and block.start <= tp.partition < block.start + block.size


class FakeFencer:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker

    async def fence(self, transactional_ids: Collection[str]) -> None:
        self.broker.fenced_ids.extend(sorted(transactional_ids))

    async def close(self) -> None:
        pass


class FakePublisher:
    """A :class:`~outboxkit.relay.publisher.Publisher` of one block, scripted by the broker."""

    def __init__(self, broker: FakeBroker, block: Block) -> None:
        self.broker = broker
        self.block = block
        self.started = False
        self.closed = False

    async def start(self) -> None:
        for tp, failures in self.broker.start_failures.items():
            if _holds(self.block, tp) and failures:
                raise failures.popleft()
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def publish(
        self, records: Sequence[OutboxRecord], times: StageTimes, *, alone: bool = False
    ) -> PublishOutcome:
        broker = self.broker
        tps = frozenset(TopicPartition(r.topic, r.partition) for r in records)
        broker.calls.append(
            PublishCall(self.block, [cast(int, r.id) for r in records], self, time.monotonic(), tps)
        )
        if not self.started or self.closed:
            state = "closed" if self.closed else "never started"
            broker.violations.append(f"publish on a publisher of {self.block} that is {state}")
            raise KafkaConnectionError(f"producer is {state}")
        keys = [(r.partition, r.key) for r in records]
        if len(set(keys)) != len(keys):
            broker.violations.append(f"two records of one key in one batch: {keys}")
        if not all(_holds(self.block, tp) for tp in tps):
            broker.violations.append(f"record of another partition sent to {self.block}")
        if broker.inspect is not None:
            broker.violations += broker.inspect(records)
        broker.in_flight += len(records)
        broker.max_in_flight = max(broker.max_in_flight, broker.in_flight)
        try:
            # A real publish always waits for the broker: whatever else the relay runs (another
            # block, the listener, a revocation) gets to run meanwhile, as it would.
            await asyncio.sleep(0)
            await broker.gate.wait()
            failure = broker._failure(self.block)
            if failure == "hang":
                await asyncio.Event().wait()
            return self._outcome(records, failure)
        finally:
            broker.in_flight -= len(records)

    def _outcome(self, records: Sequence[OutboxRecord], failure: Failure | None) -> PublishOutcome:
        broker = self.broker
        if failure == "fenced":
            raise OwnershipLostError(f"{self.block}: ProducerFenced (fake)")
        if failure == "crash":
            raise RuntimeError("a bug in the publisher (fake)")
        # A rejected record aborts a lost-ack batch: nothing of it can have reached the topic.
        if failure == "error" or (
            failure == "lost_ack" and any(broker._rejects(r) for r in records)
        ):
            raise KafkaConnectionError("connection to the broker lost (fake)")
        if failure == "lost_ack":
            for record in records:
                broker.topic[TopicPartition(record.topic, record.partition)].append(record)
            raise KafkaConnectionError("acknowledgement lost (fake)")
        outcome = PublishOutcome()
        for record in records:
            if broker._rejects(record):
                broker._count_rejection(record)
                outcome.rejected.append((record, REJECTION))
            else:
                outcome.published.append(record)
        for record in outcome.published:
            broker.topic[TopicPartition(record.topic, record.partition)].append(record)
        return outcome


class ManualOwnership:
    """The relay's ``ownership_factory``: ``start()`` reports the partition counts (and assigns
    ``initial``), ``run()`` waits until :meth:`end`, the test assigns and revokes.

    Like aiokafka's rebalance listener, ``start()`` swallows what the assignment callback
    raises (kept in ``callback_errors``)."""

    def __init__(
        self, partitions: dict[str, int], initial: frozenset[TopicPartition] = frozenset()
    ) -> None:
        self.partitions = partitions
        self.initial = initial
        self.started = False
        self.stopped = False
        self.hang_on_stop = False  # like a leave that the coordinator never answers
        #: What confirm() answers: is this member current and owning these partitions?
        self.confirms: Callable[[frozenset[TopicPartition]], bool] = lambda _: True
        self.confirmations: list[frozenset[TopicPartition]] = []
        self.callback_errors: list[Exception] = []
        #: The processes of the group's other members (the test adds them); evict_process()
        #: removes them.
        self.others: set[str] = set()
        self.evicted: list[str] = []
        #: What evict_process() raises instead, while set (the broker is down).
        self.evict_error: Exception | None = None
        #: What lapsed() answers: seconds without an answer from the coordinator, or None.
        self.lapsed_for: float | None = None
        #: step_aside() and step_in(), in order ("aside", "in").
        self.steps: list[str] = []
        self._ended = asyncio.Event()
        self._error: BaseException | None = None

    def __call__(
        self,
        settings: RelaySettings,
        on_assigned: PartitionsCallback,
        on_revoked: PartitionsCallback,
    ) -> ManualOwnership:
        self.settings = settings
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        return self

    async def start(self) -> dict[str, int]:
        self.started = True
        if self.initial:
            try:
                await self.on_assigned(self.initial)
            except Exception as exc:
                self.callback_errors.append(exc)
        return dict(self.partitions)

    def partition_counts(self) -> dict[str, int]:
        return dict(self.partitions)

    @property
    def member_id(self) -> str | None:
        return "manual-member" if self.started else None

    @property
    def process_key(self) -> str:
        return "manual-process"

    async def evict_process(self, process_key: str) -> int:
        if self.evict_error is not None:
            raise self.evict_error
        if process_key not in self.others:
            return 0
        self.others.discard(process_key)
        self.evicted.append(process_key)
        return 1

    async def confirm(self, partitions: frozenset[TopicPartition]) -> bool:
        self.confirmations.append(partitions)
        return self.confirms(partitions)

    def lapsed(self) -> float | None:
        return self.lapsed_for

    async def step_aside(self) -> None:
        self.steps.append("aside")

    def step_in(self) -> None:
        self.steps.append("in")

    async def step_aside_from(self, partitions: frozenset[TopicPartition]) -> None:
        self.steps.append(f"aside from {sorted(map(str, partitions))}")

    def avoid_nothing(self) -> None:
        self.steps.append("avoid nothing")

    async def run(self) -> None:
        await self._ended.wait()
        if self._error is not None:
            raise self._error

    def end(self, error: BaseException | None = None) -> None:
        """Make ``run()`` return, or raise ``error``."""
        self._error = error
        self._ended.set()

    async def stop(self) -> None:
        self.stopped = True
        if self.hang_on_stop:
            await asyncio.Event().wait()


@dataclass(frozen=True)
class Fetch:
    tp: TopicPartition
    found: int
    while_waiting: bool
    at: float = field(default_factory=time.monotonic)


class SpyStorage(InMemoryOutboxStorage):
    """The in-memory outbox, recording what the engine asks of it.

    ``notify=False`` drops the waiting declarations, so writers wake nobody (only the sweep
    finds new rows). ``fetch_errors`` fail the next reads; ``register_errors`` the next
    ``register_topics`` calls (None: that one succeeds), then ``register_error`` fails all.
    :meth:`signal_reconnect`, :meth:`end_session` and :meth:`announced` act on the database's
    side: a lost listener, a relay's lost session, who is announced."""

    def __init__(self, *, notify: bool = True) -> None:
        super().__init__()
        self.notify = notify
        self.declared: set[TopicPartition] = set()
        self.waiting_calls: list[tuple[TopicPartition, bool]] = []
        self.fetches: list[Fetch] = []
        self.fetch_errors: deque[BaseException] = deque()
        #: settle_and_claim calls (1-based) that fail, settling or not (odd: after settling).
        self.fail_calls: set[int] = set()
        self.calls = 0
        self.register_errors: deque[BaseException | None] = deque()
        self.register_error: BaseException | None = None
        self.register_calls = 0
        self.purges: list[tuple[timedelta, int, int]] = []

    def signal_reconnect(self) -> None:
        """Act as if the notification listener reconnected (notifications may be lost)."""
        self._wakeups.put_nowait(None)

    def end_session(self, group: str, member_id: str) -> None:
        """The relay that announced ``member_id`` lost its database session (it died)."""
        self._members[group, member_id] = False

    def announced(self, group: str) -> list[str]:
        """The member ids of ``group`` announced and not yet reported departed."""
        return sorted(member for g, member in self._members if g == group)

    async def register_topics(self, partitions: Mapping[str, int]) -> None:
        self.register_calls += 1
        error = self.register_errors.popleft() if self.register_errors else self.register_error
        if error is not None:
            raise error
        await super().register_topics(partitions)

    async def settle_and_claim(
        self,
        tps: Collection[TopicPartition],
        limit: int,
        *,
        published: Sequence[OutboxRecord] = (),
        keep: bool = False,
        depth: int = 1,
        max_bytes: int | None = None,
    ) -> list[OutboxRecord]:
        self.calls += 1
        if self.calls in self.fail_calls:
            # Half of them as a lost answer: the statement settled, the relay cannot know.
            if self.calls % 2:
                await super().settle_and_claim((), 1, published=published, keep=keep)
            raise StorageUnavailableError(f"call {self.calls} failed (fake)")
        if self.fetch_errors:
            raise self.fetch_errors.popleft()
        found = await super().settle_and_claim(
            tps, limit, published=published, keep=keep, depth=depth, max_bytes=max_bytes
        )
        for tp in sorted(tps, key=lambda t: t.partition):
            count = sum(1 for r in found if (r.topic, r.partition) == (tp.topic, tp.partition))
            self.fetches.append(Fetch(tp, count, tp in self.declared))
        return found

    async def set_waiting(self, tps: Collection[TopicPartition], waiting: bool) -> int:
        changed = 0
        for tp in sorted(tps, key=lambda t: t.partition):
            self.waiting_calls.append((tp, waiting))
            changed += (tp in self.declared) != waiting
            if waiting:
                self.declared.add(tp)
            else:
                self.declared.discard(tp)
        if self.notify:
            await super().set_waiting(tps, waiting)
        return changed

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        deleted = await super().purge_published(older_than, limit)
        self.purges.append((older_than, limit, deleted))
        return deleted

    def idle_looks(self, tp: TopicPartition) -> int:
        """Reads of ``tp`` that found nothing after its worker declared itself waiting: after
        one, the worker is in (or entering) its long wait."""
        return sum(1 for f in self.fetches if f.tp == tp and f.while_waiting and not f.found)

    def state_of(self, record: OutboxRecord) -> str | None:
        return next((state for r, state in self.rows if r.id == record.id), None)
