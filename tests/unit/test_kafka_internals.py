"""One door to aiokafka's internals: ``outboxkit/core/kafka_internals.py`` is the only module that
uses a private attribute of aiokafka's, and each of its reaches works on the installed aiokafka.

The canaries below build real aiokafka clients (no broker); the group membership's needs a
broker: tests/integration/test_kafka_internals.py. When an aiokafka release moves what a reach
uses, its canary fails, naming the reach, instead of a relay in a fault path.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import importlib
import inspect
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    KafkaConnectionError,
    ProducerFenced,
)
from aiokafka.producer import sender
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.structs import OffsetAndMetadata

from outboxkit.core import kafka_internals
from outboxkit.core.exceptions import KafkaClientMismatchError
from outboxkit.core.kafka_internals import CONCURRENT_TRANSACTIONS_BACKOFF, TransactionalProducer
from outboxkit.inbox.kafka import InboxConsumer

REPO = Path(__file__).resolve().parents[2]
#: Every folder of Python the repository holds: the product, bench/, examples/ and the tests.
SCANNED = [
    "core",
    "relay",
    "inbox",
    "schemas",
    "pipeline",
    "outboxkit",
    "bench",
    "examples",
    "tests",
]
#: The door, and the canaries of its reaches.
ALLOWED = {
    "core/kafka_internals.py",
    "tests/unit/test_kafka_internals.py",
    "tests/integration/test_kafka_internals.py",
}


# -- the door is the only one ------------------------------------------------------------------


@cache
def _private_names(source_root: Path) -> frozenset[str]:
    """Every private name aiokafka's source defines or uses: attributes, methods, classes."""
    names: set[str] = set()
    for path in source_root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Attribute):
                name = node.attr
            if name and name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return frozenset(names)


AIOKAFKA_PRIVATE = _private_names(Path(aiokafka.__file__).parent)


def _class_private_names(cls: type) -> set[str]:
    """The private names an aiokafka class and its aiokafka bases define or use on ``self``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("aiokafka"):
            continue
        for node in ast.walk(ast.parse(inspect.getsource(klass))):
            name = None
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif isinstance(node, ast.Attribute):
                name = node.attr
            if name and name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return names


def private_uses(source: str) -> list[tuple[int, str]]:
    """Where ``source`` uses a private attribute of aiokafka's: ``x._name`` for a name aiokafka
    keeps private (``self._name`` too, in a subclass of one of aiokafka's classes that has that
    name), ``getattr``/``setattr``/``hasattr`` with such a name, ``x.__dict__["_name"]``."""
    tree = ast.parse(source)
    imported: dict[str, type] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiokafka"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if isinstance(value, type):
                    imported[alias.asname or alias.name] = value
    # A class's aiokafka names: from its bases, imported or defined above it in the module.
    class_names: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            inherited: set[str] = set()
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if name in imported:
                    inherited |= _class_private_names(imported[name])
                inherited |= class_names.get(str(name), set())
            class_names[node.name] = inherited

    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, own: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            own = class_names.get(node.name, set())
        if isinstance(node, ast.Attribute) and node.attr in AIOKAFKA_PRIVATE:
            of = node.value
            on_self = isinstance(of, ast.Name) and of.id in ("self", "cls")
            on_super = isinstance(of, ast.Call) and getattr(of.func, "id", None) == "super"
            if not (on_self or on_super) or node.attr in own:
                found.append((node.lineno, ast.unparse(node)))
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in AIOKAFKA_PRIVATE
        ):
            found.append((node.lineno, ast.unparse(node)))
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "__dict__"
            and isinstance(node.slice, ast.Constant)
            and node.slice.value in AIOKAFKA_PRIVATE
        ):
            found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(tree, set())
    return found


def _python_files() -> list[Path]:
    seen: dict[Path, Path] = {}
    for folder in SCANNED:
        for path in (REPO / folder).rglob("*.py"):
            relative = path.relative_to(REPO)
            if relative.parts[0] in (".venv", "build") or ".venv" in relative.parts:
                continue
            seen.setdefault(path.resolve(), relative)
    return sorted(seen.values())


def test_no_module_but_the_door_uses_a_private_attribute_of_aiokafka() -> None:
    """A private attribute of aiokafka's used anywhere else is a reach nobody named, with no
    canary: the next aiokafka release could break it in a user's relay."""
    found = [
        f"{relative}:{line} {text}"
        for relative in _python_files()
        if str(relative) not in ALLOWED
        for line, text in private_uses((REPO / relative).read_text())
    ]
    assert not found, (
        "reach aiokafka's internals only through outboxkit/core/kafka_internals.py "
        f"(name the reach, why, and give it a canary test): {found}"
    )


def test_the_check_finds_every_form_of_reach() -> None:
    """Guards the guard: what each form looks like, and what is not a reach."""
    source = """
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

class Consumer(AIOKafkaConsumer):
    def fetch_size(self):
        return self._max_partition_fetch_bytes

class Listener(ConsumerRebalanceListener):
    def __init__(self, client):
        self._client = client  # its own attribute: ConsumerRebalanceListener has no _client

class Owner:
    def __init__(self, consumer):
        self._client = consumer  # its own attribute

    def member(self):
        return self._client._coordinator.member_id

def reaches(consumer, producer):
    getattr(consumer, "_coordinator", None)
    return producer.__dict__["_sender"], urlsplit("x")._replace(path="")
"""
    assert [text for _, text in private_uses(source)] == [
        "self._max_partition_fetch_bytes",
        "self._client._coordinator",
        "getattr(consumer, '_coordinator', None)",
        "producer.__dict__['_sender']",
    ]


def test_the_door_checks_aiokafkas_version_and_names_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka_internals.check()  # the installed one: tested, nothing missing
    with pytest.warns(RuntimeWarning, match=r"tested with aiokafka 0\.14, not 0\.15\.0"):
        kafka_internals.check("0.15.0")
    monkeypatch.setitem(
        kafka_internals.CLASS_LEVEL, "GroupMembership", ((GroupCoordinator, "_gone"),)
    )
    with pytest.raises(KafkaClientMismatchError, match=r"GroupCoordinator\._gone.*GroupMembership"):
        kafka_internals.check()


def test_pyproject_bounds_aiokafka_to_the_tested_minor_versions() -> None:
    text = (REPO / "pyproject.toml").read_text()
    (low,) = kafka_internals.TESTED_WITH
    major, minor = low.split(".")
    assert f'"aiokafka>={low},<{major}.{int(minor) + 1}"' in text
    assert aiokafka.__version__.startswith(f"{low}.")


# -- the canaries, one per reach ----------------------------------------------------------------


def _response(code: int) -> SimpleNamespace:
    return SimpleNamespace(errors=[("orders", [(0, code)])])


async def test_transactional_producer_retries_concurrent_transactions_sooner_for_itself() -> None:
    """TransactionalProducer: its sender carries what aiokafka built, its AddPartitionsToTxn
    handler retries CONCURRENT_TRANSACTIONS after 2 ms; aiokafka's other producers keep their
    20 ms (no global patch). If this fails, the relay's back-to-back transactions wait 20 ms."""
    assert sender.BACKOFF_OVERRIDE == 0.02
    ours = TransactionalProducer(bootstrap_servers="localhost:1", transactional_id="t", acks="all")
    plain = AIOKafkaProducer(bootstrap_servers="localhost:1", transactional_id="t2", acks="all")
    try:
        assert isinstance(ours._sender, kafka_internals._Sender)
        assert type(plain._sender) is sender.Sender
        assert ours._sender._txn_manager.transactional_id == "t"
        assert ours._sender._acks == -1
        assert ours._sender._message_accumulator is ours._message_accumulator
        assert ours._sender.client is ours.client

        handler = kafka_internals._AddPartitionsHandler(ours._sender, [])
        concurrent = _response(ConcurrentTransactions.errno)
        assert handler.handle_response(concurrent) == CONCURRENT_TRANSACTIONS_BACKOFF
        stock = sender.AddPartitionsToTxnHandler(plain._sender, [])
        assert stock.handle_response(concurrent) == sender.BACKOFF_OVERRIDE
        # Other answers keep aiokafka's handling.
        loading = _response(CoordinatorLoadInProgressError.errno)
        assert handler.handle_response(loading) == ours._sender._retry_backoff
    finally:
        await ours.stop()
        await plain.stop()


async def test_fence_leftovers_a_fenced_producer_leaves_no_unretrieved_error_behind() -> None:
    """_consume_failures: a fence is reported once by the relay; aiokafka's stored copies of the
    error (each pending batch's drain waiter, the transaction waiter) must not surface later as
    "Future exception was never retrieved" with a traceback."""
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    producer = TransactionalProducer(bootstrap_servers="localhost:1", acks="all", linger_ms=10_000)
    for partition in (0, 1):  # a block's batches, waiting to be sent
        sent = await producer._message_accumulator.add_message(
            KafkaTP("orders", partition), b"k", b"v", timeout=1, timestamp_ms=0
        )
        sent.add_done_callback(lambda f: f.cancelled() or f.exception())  # as the relay does
    transactional = TransactionalProducer(bootstrap_servers="localhost:1", transactional_id="t")
    # A transaction is open: the fence (fatal_error) stores the error in its waiter.
    transactional._txn_manager._transaction_waiter = loop.create_future()
    failed_sender = loop.create_future()
    failed_sender.set_exception(ProducerFenced())
    for each in (producer, transactional):
        each._sender._fail_all(failed_sender)  # the sender routine ended, fenced
        await each.stop()
    del producer, transactional, each, sent
    gc.collect()
    assert [c["message"] for c in reported] == []


async def test_abandoned_commits_read_a_commit_given_up_fails_later_without_a_traceback() -> None:
    """abandoned_commits_read: aiokafka sends an offset commit in a task of its own, under
    ``asyncio.shield`` (as here, with a coordinator whose link is half-open). The caller gives
    up; when the link closes, the commit fails, and no "Task exception was never retrieved"."""
    link_closed = asyncio.Event()

    async def send_req(request: Any) -> Any:
        await link_closed.wait()
        raise KafkaConnectionError("Connection at 127.0.0.1:9092 closed")

    coordinator = SimpleNamespace(
        group_id="g", generation=1, member_id="m", coordinator_id=1, _send_req=send_req
    )
    sent = {KafkaTP("t", 0): OffsetAndMetadata(7, "")}
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await asyncio.shield(GroupCoordinator._do_commit_offsets(coordinator, {}, sent))
    kafka_internals.abandoned_commits_read()
    link_closed.set()
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()  # a task's unread exception is reported when the task is collected
    assert unhandled == []


async def test_consumer_client_is_the_consumers_own_low_level_client() -> None:
    """consumer_client: the client the inbox's consumer fetches with, whose cluster metadata
    names the partition leaders and whose ``send`` takes a Fetch request."""
    consumer = InboxConsumer(bootstrap_servers="localhost:1", max_partition_fetch_bytes=5 << 20)
    try:
        client = kafka_internals.consumer_client(consumer)
        assert isinstance(client, AIOKafkaClient)
        assert client.cluster is consumer._client.cluster
        assert callable(client.send)
        assert client.cluster.leader_for_partition(KafkaTP("t", 0)) is None
        assert consumer._fetch_bytes == 5 << 20
    finally:
        await consumer.stop()


async def test_producer_id_is_unknown_before_the_broker_gives_one() -> None:
    """producer_id (bench's broker probes)."""
    producer = AIOKafkaProducer(bootstrap_servers="localhost:1", enable_idempotence=True)
    try:
        assert kafka_internals.producer_id(producer) == -1
    finally:
        await producer.stop()


def test_request_versions_are_the_versions_aiokafka_can_send() -> None:
    """request_versions (bench's broker probes): Fetch up to v11 in aiokafka 0.14."""
    versions = kafka_internals.request_versions(FetchRequest)
    assert versions == sorted(versions)
    assert versions[-1] == 11


async def test_group_membership_of_a_consumer_not_started() -> None:
    """GroupMembership before ``start()``: no coordinator yet (the rest of its canary joins a
    group on a broker: tests/integration/test_kafka_internals.py)."""
    consumer = AIOKafkaConsumer(bootstrap_servers="localhost:1", group_id="g")
    try:
        group = kafka_internals.GroupMembership(consumer)
        assert (group.member_id, group.coordinator_known, group.rejoining) == (None, False, True)
        assert group.on_heartbeat_answered(lambda: None) is False
    finally:
        await consumer.stop()
