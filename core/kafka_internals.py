"""aiokafka's private internals: the one module of outboxkit that reaches them.

Everywhere else outboxkit uses aiokafka's public API; ``tests/unit/test_kafka_internals.py``
fails on a private attribute of aiokafka's used in any other module (the product, bench/,
examples/ and the tests). Each reach below says what it reaches for, why no public API does it,
and what the relay or inbox would lose without it. Each has a canary test against the installed
aiokafka (``tests/unit/test_kafka_internals.py``; the group membership, which needs a broker, in
``tests/integration/test_kafka_internals.py``), so a release that moves one fails CI naming the
reach, not a relay in a fault path. ``pyproject.toml`` bounds aiokafka to
:data:`TESTED_WITH`; importing this module warns on any other version and refuses one that lacks
a class-level name a reach calls (:func:`check`).

The reaches, each with aiokafka's private names it uses:

- :class:`TransactionalProducer` (``AIOKafkaProducer._sender``; ``Sender._fail_all``,
  ``_find_coordinator``, ``_do_add_partitions_to_txn`` and the ``_acks``, ``_txn_manager``,
  ``_message_accumulator``, ``_retry_backoff``, ``_request_timeout_ms`` it was built with): the
  relay's producer retries AddPartitionsToTxn after CONCURRENT_TRANSACTIONS in 2 ms, not 20 ms.
  aiokafka's only knob is a module global (``sender.BACKOFF_OVERRIDE``) that would change every
  producer of the process. Without it each of the relay's back-to-back transactions waits
  ~20 ms more.
- Fence leftovers (:func:`_consume_failures`: ``_message_accumulator._batches`` and
  ``_pending_batches``, each batch's ``_drain_waiter``, ``_txn_manager._transaction_waiter``): a
  fenced producer's errors, stored where only a waiting call would read them, are marked read.
  Without it every fence logs "Future exception was never retrieved" with a traceback per batch.
- :class:`GroupMembership` (``AIOKafkaConsumer._coordinator``: ``member_id``, ``generation``,
  ``coordinator_id``, ``_rejoin_needed_fut``, ``_do_heartbeat``): the relay's clock of its group
  coordinator's answers, which tells it that its membership lapsed behind a half-open link; its
  member id for operators; no membership confirmed while it rejoins. aiokafka has no public
  view of a consumer's membership. Without it a relay cut off from its coordinator keeps
  reporting partitions the group has moved.
- :func:`abandoned_commits_read` (``GroupCoordinator._do_commit_offsets``): an offset commit its
  caller gave up fails later without "Task exception was never retrieved".
- :func:`consumer_client` (``AIOKafkaConsumer._client``): the inbox fetches the batch of a record
  aiokafka cannot read itself, on the consumer's connections (``inbox/kafka.py``). Without it
  such a record stops its partition.
- :func:`producer_id`, :func:`request_versions` (``_txn_manager.producer_id``, a request class's
  ``_CLASSES``): ``bench/broker_probes`` reports the producer id a broker gave and the versions
  of each request aiokafka can send.

Done with aiokafka's public API instead (no reach): removing a dead relay from its group is a
LeaveGroup sent through a low-level ``AIOKafkaClient`` (exported by aiokafka) rather than the
admin client's private ``_send_request``; the inbox's fetch size is the one it configured,
not the consumer's ``_max_partition_fetch_bytes``; bench reads a broker's API versions with an
``ApiVersionRequest`` rather than a connection's ``_versions``.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import aiokafka
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import CoordinationType
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import ConcurrentTransactions, for_code
from aiokafka.producer.sender import AddPartitionsToTxnHandler, Sender
from aiokafka.protocol.api import Request
from aiokafka.protocol.fetch import FetchRequest

from outboxkit.core.exceptions import KafkaClientMismatchError

__all__ = [
    "CONCURRENT_TRANSACTIONS_BACKOFF",
    "TESTED_WITH",
    "GroupMembership",
    "TransactionalProducer",
    "abandoned_commits_read",
    "check",
    "consumer_client",
    "producer_id",
    "request_versions",
]

#: The aiokafka minor versions these reaches were tested with (pyproject.toml's bound).
TESTED_WITH = ("0.14",)

#: The class-level names the reaches call, by reach: :func:`check` refuses an aiokafka without
#: one. (Instance attributes exist only on a client built, so their canaries build one.)
CLASS_LEVEL: dict[str, tuple[tuple[type, str], ...]] = {
    "TransactionalProducer": (
        (Sender, "_fail_all"),
        (Sender, "_find_coordinator"),
        (Sender, "_do_add_partitions_to_txn"),
        (AddPartitionsToTxnHandler, "handle_response"),
    ),
    "GroupMembership": ((GroupCoordinator, "_do_heartbeat"),),
    "abandoned_commits_read": ((GroupCoordinator, "_do_commit_offsets"),),
    "request_versions": ((FetchRequest, "_CLASSES"),),
}


def check(version: str = aiokafka.__version__) -> None:
    """Warn if ``version`` of aiokafka is not one of :data:`TESTED_WITH`; raise
    :class:`KafkaClientMismatchError` if the installed aiokafka lacks a name a reach calls."""
    minor = ".".join(version.split(".")[:2])
    if minor not in TESTED_WITH:
        warnings.warn(
            f"outboxkit was tested with aiokafka {', '.join(TESTED_WITH)}, not {version}: "
            "the private internals it reaches (outboxkit/core/kafka_internals.py) may have moved",
            RuntimeWarning,
            stacklevel=2,
        )
    for reach, names in CLASS_LEVEL.items():
        for owner, name in names:
            if not hasattr(owner, name):
                raise KafkaClientMismatchError(
                    f"aiokafka {version} has no {owner.__name__}.{name}, which outboxkit's "
                    f"{reach} (outboxkit/core/kafka_internals.py) calls; install aiokafka "
                    f"{' or '.join(TESTED_WITH)}.x, the versions outboxkit was tested with"
                )


# -- the relay's transactional producer ---------------------------------------------------------

#: Seconds before the first AddPartitionsToTxn of a transaction is retried after
#: CONCURRENT_TRANSACTIONS (the broker still writes the previous transaction's markers,
#: KAFKA-5477). aiokafka waits 20 ms (``sender.BACKOFF_OVERRIDE``); on a healthy broker the
#: markers take a few ms, so back-to-back transactions would mostly wait for nothing
#: (bench/results/relay.md, "Measurements": Kafka transactions back to back). Only this retry
#: changes, and only for :class:`TransactionalProducer`.
CONCURRENT_TRANSACTIONS_BACKOFF = 0.002


class _AddPartitionsHandler(AddPartitionsToTxnHandler):  # type: ignore[misc]
    def handle_response(self, resp: Any) -> float | None:
        backoff: float | None = super().handle_response(resp)
        concurrent = any(
            for_code(code) is ConcurrentTransactions
            for _topic, partitions in resp.errors
            for _partition, code in partitions
        )
        if backoff is not None and concurrent and not self._sender._txn_manager.txn_partitions:
            return CONCURRENT_TRANSACTIONS_BACKOFF
        return backoff


def _consume_failures(sender: Any) -> None:
    """A fenced producer fails its pending batches and its transaction: aiokafka stores the
    error (ProducerFenced) in futures that only a waiting call would read (each batch's drain
    waiter, the transaction waiter). The relay reports the fence itself, once; mark those read,
    or asyncio logs "Future exception was never retrieved" with a traceback for each."""
    accumulator = getattr(sender, "_message_accumulator", None)
    batches = [
        *(b for queue in getattr(accumulator, "_batches", {}).values() for b in queue),
        *getattr(accumulator, "_pending_batches", ()),
    ]
    waiters = [getattr(b, "_drain_waiter", None) for b in batches]
    waiters.append(getattr(getattr(sender, "_txn_manager", None), "_transaction_waiter", None))
    for waiter in waiters:
        if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
            waiter.exception()


class _Sender(Sender):  # type: ignore[misc]
    def _fail_all(self, task: Any) -> None:
        super()._fail_all(task)
        _consume_failures(self)

    async def _do_add_partitions_to_txn(self, tps: Any) -> Any:
        node_id = await self._find_coordinator(
            CoordinationType.TRANSACTION, self._txn_manager.transactional_id
        )
        return await _AddPartitionsHandler(self, tps).do(node_id)


class TransactionalProducer(AIOKafkaProducer):  # type: ignore[misc]
    """aiokafka's producer with :data:`CONCURRENT_TRANSACTIONS_BACKOFF`, and quiet about a fence
    it has already reported. It swaps the sender that ``AIOKafkaProducer.__init__`` built (same
    arguments) for one whose AddPartitionsToTxn handler retries sooner and which marks the
    errors a fence leaves in aiokafka's futures as read (:func:`_consume_failures`)."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        built: Any = self.__dict__["_sender"]
        self._sender = _Sender(
            built.client,
            acks=built._acks,
            txn_manager=built._txn_manager,
            message_accumulator=built._message_accumulator,
            retry_backoff_ms=built._retry_backoff * 1000,
            request_timeout_ms=built._request_timeout_ms,
        )

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            _consume_failures(self.__dict__["_sender"])


# -- a consumer's group membership --------------------------------------------------------------


class GroupMembership:
    """What aiokafka's consumer knows of its group membership and keeps to itself: its group
    coordinator (``AIOKafkaConsumer._coordinator``, made by ``start()``; None before)."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer

    def _group(self) -> Any:
        return getattr(self._consumer, "_coordinator", None)

    @property
    def member_id(self) -> str | None:
        """The member id the group gave this consumer, once joined."""
        member_id = getattr(self._group(), "member_id", None)
        return member_id if isinstance(member_id, str) and member_id else None

    @property
    def coordinator_known(self) -> bool:
        """Whether the consumer knows which broker coordinates its group (it forgets when that
        broker refuses or drops the connection, and looks it up again)."""
        return getattr(self._group(), "coordinator_id", None) is not None

    @property
    def rejoining(self) -> bool:
        """Whether the consumer is not, or not yet again, a member of the group's current
        generation: not started, no member id or generation, or a rejoin requested (a
        rebalance, a commit refused as from an unknown member)."""
        group = self._group()
        if group is None:
            return True
        return not group.member_id or group.generation < 0 or group._rejoin_needed_fut.done()

    def on_heartbeat_answered(self, heard: Callable[[], None]) -> bool:
        """Call ``heard()`` each time the group coordinator answers a heartbeat (also while the
        group rebalances: the member is still in it). aiokafka keeps the time of the last one to
        itself (a local of its heartbeat task), so the coordinator's heartbeat is wrapped.
        False, and nothing is wrapped, if the consumer has no coordinator (not started)."""
        group = self._group()
        beat = getattr(group, "_do_heartbeat", None)
        if beat is None:
            return False

        async def heartbeat() -> bool:
            answered = bool(await beat())
            if answered:
                heard()
            return answered

        group._do_heartbeat = heartbeat
        return True


#: The coroutine aiokafka sends an offset commit with, in a task of its own.
_COMMIT_CODE = GroupCoordinator._do_commit_offsets.__code__


def abandoned_commits_read() -> None:
    """Mark the outcome of every offset commit still in flight as read, once it comes.

    ``AIOKafkaConsumer.commit`` sends the request in a task under ``asyncio.shield``. When the
    caller's wait is cancelled (a timeout, a stop), Python unhooks the shield from that task, so
    its failure, when the connection finally closes (a half-open link), was logged as "Task
    exception was never retrieved" with a traceback. The caller has already given that commit
    up and said so; call this right after cancelling a wait on one."""
    for task in asyncio.all_tasks():
        if getattr(task.get_coro(), "cr_code", None) is _COMMIT_CODE:
            task.add_done_callback(_read_outcome)


def _read_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


# -- a consumer's connections -------------------------------------------------------------------


def consumer_client(consumer: AIOKafkaConsumer) -> AIOKafkaClient:
    """The low-level client a consumer fetches with: its connections to the partition leaders,
    with the consumer's TLS and SASL settings."""
    client: AIOKafkaClient = consumer._client
    return client


# -- bench's broker probes ----------------------------------------------------------------------


def producer_id(producer: AIOKafkaProducer) -> int:
    """The producer id the broker gave an idempotent or transactional producer (-1 before)."""
    pid: int = producer._txn_manager.producer_id
    return pid


def request_versions(request: type[Request]) -> list[int]:
    """The versions of ``request`` aiokafka can send, oldest first."""
    return sorted(int(each.API_VERSION) for each in vars(request)["_CLASSES"])


check()
