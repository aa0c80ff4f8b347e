"""Measure what a Kafka-protocol broker supports, as seen by aiokafka.

Run against a live broker; every probe creates its own uniquely named topics and is bounded
in time, and the run prints one table row per fact::

    python bench/broker_features.py --bootstrap 127.0.0.1:29092 --label kafka-4.4.0
    python bench/broker_features.py --bootstrap 127.0.0.1:39092 --label tansu-0.6

``--only fencing_zombie,group_classic`` runs a subset, ``--list`` names the probes.
Some probes run a second copy of this script as a child process (``--child ...``) so that
a member or producer can be frozen (SIGSTOP) or killed (SIGKILL) like a real process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.partitioner import murmur2
from aiokafka.protocol import (
    admin,
    commit,
    coordination,
    fetch,
    group,
    metadata,
    offset,
    produce,
    transaction,
)

OK = "ok"
FAIL = "FAIL"
INFO = "info"
CHILD_READY_TIMEOUT = 30.0


class ProbeFailed(Exception):
    """A probe observed something other than what the broker feature promises."""


@dataclass
class Row:
    probe: str
    status: str
    seconds: float
    detail: str


@dataclass
class Ctx:
    bootstrap: str
    label: str
    admin: AIOKafkaAdminClient
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    rows: list[Row] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    kafka_jars: str | None = None

    def add(self, probe: str, status: str, seconds: float, detail: str) -> None:
        row = Row(probe, status, seconds, detail)
        self.rows.append(row)
        print(f"  {status:4} {probe} ({seconds:.2f}s) {detail}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- helpers


def since(t0: float) -> float:
    return time.monotonic() - t0


def describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no error"
    module = type(exc).__module__
    name = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
    text = str(exc).strip()
    return f"{name}: {text}" if text else name


async def outcome(awaitable: Awaitable[Any], limit: float = 20.0) -> BaseException | None:
    """Await and return the exception it raised (None when it succeeded)."""
    try:
        await asyncio.wait_for(awaitable, limit)
    except Exception as exc:
        return exc
    return None


async def stop_quietly(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.stop(), 15)


@contextlib.asynccontextmanager
async def running(producer: AIOKafkaProducer) -> AsyncIterator[AIOKafkaProducer]:
    """Start a producer and always stop it, also when start() itself failed."""
    try:
        await producer.start()
        yield producer
    finally:
        await stop_quietly(producer)


async def wait_until(predicate: Callable[[], bool], limit: float, what: str) -> float:
    t0 = time.monotonic()
    while not predicate():
        if since(t0) > limit:
            raise ProbeFailed(f"timed out after {limit:.0f}s waiting for {what}")
        await asyncio.sleep(0.01)
    return since(t0)


async def create_topic(ctx: Ctx, probe: str, partitions: int = 1) -> str:
    name = f"okbench-{ctx.run_id}-{probe}-{uuid.uuid4().hex[:6]}"
    resp = await ctx.admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=10000)
    for topic_error in resp.topic_errors:
        if topic_error[1]:
            raise ProbeFailed(f"create_topics({name}) error code {topic_error[1]}: {topic_error}")
    ctx.topics.append(name)
    return name


def new_producer(ctx: Ctx, **kwargs: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=ctx.bootstrap, acks="all", request_timeout_ms=15000, **kwargs
    )


def new_consumer(bootstrap: str, **kwargs: Any) -> AIOKafkaConsumer:
    kwargs.setdefault("auto_offset_reset", "earliest")
    kwargs.setdefault("enable_auto_commit", False)
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15000, **kwargs)


@dataclass
class Read:
    records: list[ConsumerRecord[bytes, bytes]]
    seconds: float
    found: bool

    @property
    def values(self) -> list[bytes | None]:
        return [r.value for r in self.records]


async def read_until(
    ctx: Ctx,
    topic: str,
    sentinel: bytes,
    isolation: str = "read_uncommitted",
    *,
    limit: float = 15.0,
    partitions: int = 1,
) -> Read:
    """Read the topic from the beginning until a record with value `sentinel` shows up."""
    consumer = new_consumer(ctx.bootstrap, isolation_level=isolation)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: list[ConsumerRecord[bytes, bytes]] = []
    t0 = time.monotonic()
    try:
        await consumer.start()
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while since(t0) < limit:
            batch = await consumer.getmany(timeout_ms=200)
            for tp in sorted(batch):
                records.extend(batch[tp])
            if any(r.value == sentinel for r in records):
                return Read(records, since(t0), True)
    finally:
        await stop_quietly(consumer)
    return Read(records, since(t0), False)


def show(values: Iterable[bytes | None]) -> str:
    return "[" + ",".join("None" if v is None else v.decode(errors="replace") for v in values) + "]"


# --------------------------------------------------------------------------- protocol


VERSIONED_REQUESTS: Sequence[type[Any]] = (
    produce.ProduceRequest,
    fetch.FetchRequest,
    offset.OffsetRequest,
    metadata.MetadataRequest,
    commit.OffsetCommitRequest,
    commit.OffsetFetchRequest,
    coordination.FindCoordinatorRequest,
    group.JoinGroupRequest,
    group.SyncGroupRequest,
    group.HeartbeatRequest,
    group.LeaveGroupRequest,
    transaction.InitProducerIdRequest,
    transaction.AddPartitionsToTxnRequest,
    transaction.AddOffsetsToTxnRequest,
    transaction.EndTxnRequest,
    transaction.TxnOffsetCommitRequest,
    admin.CreateTopicsRequest,
    admin.DeleteTopicsRequest,
    admin.DescribeGroupsRequest,
    admin.ListGroupsRequest,
)


def negotiated(request: type[Any], broker: dict[int, tuple[int, int]]) -> tuple[str, bool]:
    """Which version aiokafka will use for `request` against the broker's advertised range."""
    ours = [c.API_VERSION for c in request._CLASSES]
    name = request.__name__.removesuffix("Request")
    if request.API_KEY not in broker:
        return f"{name}: not offered by broker", False
    low, high = broker[request.API_KEY]
    usable = [v for v in ours if low <= v <= high]
    if not usable:
        return f"{name}: NONE (aiokafka v{min(ours)}-{max(ours)}, broker v{low}-{high})", False
    return f"{name} v{max(usable)} (broker v{low}-{high})", True


async def probe_protocol(ctx: Ctx) -> None:
    t0 = time.monotonic()
    host, port = ctx.bootstrap.split(",")[0].rsplit(":", 1)
    conn = await create_conn(host, int(port), request_timeout_ms=10000)
    broker: dict[int, tuple[int, int]] = dict(conn._versions)
    conn.close()
    results = [negotiated(r, broker) for r in VERSIONED_REQUESTS]
    missing = [text for text, ok in results if not ok]
    status = OK if not missing else FAIL
    detail = "; ".join(missing) if missing else ", ".join(text for text, _ in results)
    ctx.add("protocol_api_versions", status, since(t0), detail)


# --------------------------------------------------------------------------- produce / consume


async def probe_plain(ctx: Ctx) -> None:
    topic = await create_topic(ctx, "plain")
    t0 = time.monotonic()
    async with running(new_producer(ctx)) as producer:
        for i in range(5):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i}".encode())
        await producer.send_and_wait(topic, b"nullkey", key=None)
        await producer.send_and_wait(topic, None, key=b"tombstone")
        await producer.send_and_wait(topic, b"END")
    produced = since(t0)
    read = await read_until(ctx, topic, b"END")
    got = [(r.key, r.value) for r in read.records]
    want: list[tuple[bytes | None, bytes | None]] = [
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(5)
    ]
    want += [(None, b"nullkey"), (b"tombstone", None), (None, b"END")]
    status = OK if got == want else FAIL
    detail = f"8 records acks=all in {produced:.2f}s, read back in {read.seconds:.2f}s"
    ctx.add("produce_consume_acks_all", status, since(t0), detail if got == want else repr(got))
    null_key = read.found and read.records[5].key is None
    ctx.add("null_key", OK if null_key else FAIL, 0.0, "key None round-trips as None")
    tomb = read.found and read.records[6].value is None
    ctx.add("null_value_tombstone", OK if tomb else FAIL, 0.0, "value None round-trips as None")


HEADERS: list[tuple[str, bytes]] = [
    ("dup", b"first"),
    ("bin", bytes(range(256))),
    ("dup", b"second"),
    ("empty", b""),
    ("utf8-\u00e9", "\u00e9t\u00e9".encode()),
    ("dup", b"third"),
]


async def probe_headers(ctx: Ctx) -> None:
    topic = await create_topic(ctx, "headers")
    t0 = time.monotonic()
    async with running(new_producer(ctx)) as producer:
        await producer.send_and_wait(topic, b"END", headers=HEADERS)
    read = await read_until(ctx, topic, b"END")
    got = list(read.records[0].headers) if read.found else []
    same = [(k, bytes(v)) for k, v in got] == HEADERS
    detail = "6 headers incl. 3x 'dup' in order, 256 raw bytes, empty value, non-ASCII name"
    ctx.add("headers_roundtrip", OK if same else FAIL, since(t0), detail if same else repr(got))
    await probe_null_header(ctx, topic)


async def probe_null_header(ctx: Ctx, topic: str) -> None:
    t0 = time.monotonic()
    async with running(new_producer(ctx)) as producer:
        err = await outcome(producer.send_and_wait(topic, b"END2", headers=[("nul", None)]))
    if err is not None:
        ctx.add("header_null_value", FAIL, since(t0), f"send: {describe(err)}")
        return
    read = await read_until(ctx, topic, b"END2")
    got = list(read.records[-1].headers) if read.found else None
    status = OK if got == [("nul", None)] else FAIL
    ctx.add("header_null_value", status, since(t0), f"read back {got!r}")


async def probe_idempotent(ctx: Ctx) -> None:
    topic = await create_topic(ctx, "idem")
    t0 = time.monotonic()
    producer = new_producer(ctx, enable_idempotence=True)
    try:
        await producer.start()
        init = since(t0)
        futures = [await producer.send(topic, f"{i}".encode()) for i in range(200)]
        await producer.send_and_wait(topic, b"END")
        await asyncio.gather(*futures)
        pid = producer._txn_manager.producer_id
    finally:
        await stop_quietly(producer)
    read = await read_until(ctx, topic, b"END")
    want = [f"{i}".encode() for i in range(200)] + [b"END"]
    status = OK if read.values == want else FAIL
    detail = f"producer_id={pid}, init {init:.2f}s, 200 pipelined sends in order, no duplicates"
    ctx.add("idempotent_producer", status, since(t0), detail if status == OK else show(read.values))


# --------------------------------------------------------------------------- transactions


async def run_txn(
    producer: AIOKafkaProducer, topic: str, values: Sequence[bytes], commit: bool
) -> None:
    await producer.begin_transaction()
    for value in values:
        await producer.send_and_wait(topic, value)
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()


async def probe_transactions(ctx: Ctx) -> None:
    topic = await create_topic(ctx, "txn")
    t0 = time.monotonic()
    producer = new_producer(ctx, transactional_id=f"okbench-{ctx.run_id}-txn")
    try:
        await producer.start()
        init = since(t0)
        t1 = time.monotonic()
        await run_txn(producer, topic, [b"c1", b"c2"], commit=True)
        commit_s = since(t1)
        await run_txn(producer, topic, [b"a1"], commit=False)
        await run_txn(producer, topic, [b"c3", b"END"], commit=True)
    finally:
        await stop_quietly(producer)
    ctx.add("txn_commit_abort", OK, since(t0), f"init {init:.2f}s, 2-record commit {commit_s:.2f}s")
    await check_isolation(ctx, topic)


async def check_isolation(ctx: Ctx, topic: str) -> None:
    t0 = time.monotonic()
    committed = await read_until(ctx, topic, b"END", "read_committed")
    status = OK if committed.values == [b"c1", b"c2", b"c3", b"END"] else FAIL
    ctx.add("read_committed", status, since(t0), f"sees {show(committed.values)}")
    t0 = time.monotonic()
    uncommitted = await read_until(ctx, topic, b"END", "read_uncommitted")
    status = OK if uncommitted.values == [b"c1", b"c2", b"a1", b"c3", b"END"] else FAIL
    ctx.add("read_uncommitted", status, since(t0), f"sees {show(uncommitted.values)}")


async def probe_fencing_between(ctx: Ctx) -> None:
    """Old producer A between transactions; B (same transactional_id) initialises."""
    topic = await create_topic(ctx, "fence")
    txid = f"okbench-{ctx.run_id}-fence"
    old = new_producer(ctx, transactional_id=txid)
    new = new_producer(ctx, transactional_id=txid)
    t0 = time.monotonic()
    try:
        await old.start()
        await run_txn(old, topic, [b"a1"], commit=True)
        t1 = time.monotonic()
        await new.start()
        init = since(t1)
        await old.begin_transaction()
        send_err = await outcome(old.send_and_wait(topic, b"a2-zombie"))
        commit_err = await outcome(old.commit_transaction())
        abort_err = await outcome(old.abort_transaction())
        await run_txn(new, topic, [b"b1", b"END"], commit=True)
    finally:
        await stop_quietly(old)
        await stop_quietly(new)
    detail = (
        f"B init {init:.2f}s; A.begin_transaction ok (local); A.send -> {describe(send_err)}; "
        f"A.commit -> {describe(commit_err)}; A.abort -> {describe(abort_err)}"
    )
    ctx.add("fencing_between_txns", OK if send_err else FAIL, since(t0), detail)
    read = await read_until(ctx, topic, b"END", "read_committed")
    status = OK if read.values == [b"a1", b"b1", b"END"] else FAIL
    ctx.add(
        "fencing_between_txns_visible", status, read.seconds, f"read_committed {show(read.values)}"
    )


async def probe_fencing_zombie(ctx: Ctx) -> None:
    """Producer A (child process) has an open transaction and is frozen; B takes over."""
    topic = await create_topic(ctx, "zombie")
    txid = f"okbench-{ctx.run_id}-zombie"
    child = await spawn_child(ctx, "zombie", topic, txid)
    t0 = time.monotonic()
    try:
        await child.expect("sent")
        os.kill(child.pid, signal.SIGSTOP)
        await takeover_while_frozen(ctx, topic, txid)
        os.kill(child.pid, signal.SIGCONT)
        child.send("go")
        result = await child.expect("result")
    finally:
        await child.close()
    detail = (
        f"thawed A (open txn, partition already in txn): send -> {result['send']}; "
        f"commit -> {result['commit']}; abort -> {result['abort']}"
    )
    ctx.add(
        "fencing_zombie_after_thaw", OK if result["send"] != "no error" else FAIL, since(t0), detail
    )
    await finish_and_check(ctx, topic, txid)


async def takeover_while_frozen(ctx: Ctx, topic: str, txid: str) -> None:
    new = new_producer(ctx, transactional_id=txid)
    t0 = time.monotonic()
    try:
        await new.start()
        init = since(t0)
        await run_txn(new, topic, [b"b1"], commit=True)
    finally:
        await stop_quietly(new)
    rc = await read_until(ctx, topic, b"b1", "read_committed")
    ru = await read_until(ctx, topic, b"b1", "read_uncommitted")
    aborted = rc.values == [b"b1"] and b"a1-open" in ru.values
    detail = (
        f"B init {init:.2f}s while A frozen with open txn; read_committed {show(rc.values)}, "
        f"read_uncommitted {show(ru.values)} -> A's open txn was "
        + ("ABORTED by B's init" if aborted else "NOT aborted")
    )
    ctx.add("fencing_zombie_init_aborts_open_txn", OK if aborted else FAIL, since(t0), detail)


async def finish_and_check(ctx: Ctx, topic: str, txid: str) -> None:
    new = new_producer(ctx, transactional_id=txid)
    try:
        await new.start()
        await run_txn(new, topic, [b"END"], commit=True)
    finally:
        await stop_quietly(new)
    read = await read_until(ctx, topic, b"END", "read_committed")
    status = OK if read.values == [b"b1", b"END"] else FAIL
    ctx.add("fencing_zombie_visible", status, read.seconds, f"read_committed {show(read.values)}")


async def probe_abandoned_txn(ctx: Ctx) -> None:
    """An open transaction nobody takes over: how long does it hold back read_committed?"""
    topic = await create_topic(ctx, "hang")
    hung = new_producer(
        ctx, transactional_id=f"okbench-{ctx.run_id}-hang", transaction_timeout_ms=5000
    )
    other = new_producer(ctx, transactional_id=f"okbench-{ctx.run_id}-other")
    try:
        await hung.start()
        await hung.begin_transaction()
        await hung.send_and_wait(topic, b"h1-open")
        t0 = time.monotonic()
        await other.start()
        await run_txn(other, topic, [b"END"], commit=True)
        read = await read_until(ctx, topic, b"END", "read_committed", limit=45)
        held = since(t0)
        late = await outcome(hung.commit_transaction())
    finally:
        await stop_quietly(hung)
        await stop_quietly(other)
    detail = (
        f"transaction_timeout_ms=5000: a later committed record became visible to "
        f"read_committed after {held:.1f}s (sees {show(read.values)}); "
        f"abandoned producer's commit -> {describe(late)}"
    )
    ctx.add("abandoned_txn_blocks_lso", OK if read.found else FAIL, held, detail)


# --------------------------------------------------------------------------- consumer groups


@dataclass
class Member:
    """An in-process group member that keeps polling and logs its rebalance callbacks."""

    name: str
    consumer: AIOKafkaConsumer
    log: list[str]
    t0: float
    assigned: set[int] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    polling: bool = True
    polls: int = 0
    last_poll: float = 0.0

    async def run(self) -> None:
        while True:
            if self.polling:
                await self.consumer.getmany(timeout_ms=200)
                self.polls += 1
                self.last_poll = time.monotonic()
            else:
                await asyncio.sleep(0.01)


class Recorder(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: Member) -> None:
        self.member = member

    def _note(self, what: str, tps: Iterable[TopicPartition]) -> list[int]:
        parts = sorted(tp.partition for tp in tps)
        self.member.log.append(f"{since(self.member.t0):6.2f}s {self.member.name}.{what}{parts}")
        return parts

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._note("revoked", revoked)
        self.member.assigned = set()

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        tps = list(assigned)
        self.member.assigned = set(self._note("assigned", tps))


@dataclass(frozen=True)
class GroupCfg:
    name: str
    session_ms: int
    heartbeat_ms: int

    def kwargs(self) -> dict[str, int]:
        return {"session_timeout_ms": self.session_ms, "heartbeat_interval_ms": self.heartbeat_ms}


FAST = GroupCfg("session6000/hb500", 6000, 500)
DEFAULTS = GroupCfg("defaults(session10000/hb3000)", 10000, 3000)


@dataclass
class Spot:
    """Where a group scenario happens: its topic, group and shared callback log."""

    topic: str
    group_id: str
    log: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)


async def start_member(ctx: Ctx, spot: Spot, name: str, cfg: GroupCfg, **kw: Any) -> Member:
    consumer = new_consumer(ctx.bootstrap, group_id=spot.group_id, **cfg.kwargs(), **kw)
    member = Member(name, consumer, spot.log, spot.t0)
    consumer.subscribe([spot.topic], listener=Recorder(member))
    try:
        await consumer.start()
    except BaseException:
        await stop_quietly(consumer)
        raise
    member.task = asyncio.create_task(member.run())
    return member


async def stop_polling(member: Member) -> None:
    if member.task is not None:
        member.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await member.task
        member.task = None


async def stop_member(member: Member) -> None:
    await stop_polling(member)
    await stop_quietly(member.consumer)


async def new_spot(ctx: Ctx, probe: str, partitions: int) -> Spot:
    topic = await create_topic(ctx, probe, partitions=partitions)
    return Spot(topic, f"okbench-{ctx.run_id}-{probe}-{uuid.uuid4().hex[:6]}")


async def probe_group(ctx: Ctx, cfg: GroupCfg) -> None:
    spot = await new_spot(ctx, "group", 4)
    t0 = time.monotonic()
    first = await start_member(ctx, spot, "m1", cfg)
    second: Member | None = None
    try:
        started = since(t0)
        await wait_until(lambda: first.assigned == {0, 1, 2, 3}, 60, "m1 assignment")
        detail = f"consumer.start() returned after {started:.2f}s; on_partitions_assigned[0..3]"
        ctx.add(f"group_first_join [{cfg.name}]", OK, since(t0), detail)
        second = await group_second_join(ctx, cfg, first, spot)
        await describe_group(ctx, cfg, spot.group_id)
        await group_clean_leave(ctx, cfg, first, second)
        await group_killed_member(ctx, cfg, first, spot)
    finally:
        if second is not None:
            await stop_member(second)
        await stop_member(first)
        ctx.add(f"group_callback_log [{cfg.name}]", INFO, since(spot.t0), " | ".join(spot.log))


async def group_second_join(ctx: Ctx, cfg: GroupCfg, first: Member, spot: Spot) -> Member:
    t0 = time.monotonic()
    second = await start_member(ctx, spot, "m2", cfg)
    await wait_until(
        lambda: len(first.assigned) == 2 and first.assigned | second.assigned == {0, 1, 2, 3},
        60,
        "2-way split",
    )
    detail = (
        f"m2.start() -> both assigned 2+2 "
        f"(m1 {sorted(first.assigned)}, m2 {sorted(second.assigned)})"
    )
    ctx.add(f"group_rebalance_on_join [{cfg.name}]", OK, since(t0), detail)
    return second


async def describe_group(ctx: Ctx, cfg: GroupCfg, group_id: str) -> None:
    t0 = time.monotonic()
    err: BaseException | None = None
    try:
        responses = await asyncio.wait_for(ctx.admin.describe_consumer_groups([group_id]), 15)
        groups = [g for resp in responses for g in resp.groups]
        detail = "; ".join(
            f"error={g[0]} state={g[2]} protocol_type={g[3]} assignor={g[4]} members={len(g[5])}"
            for g in groups
        )
    except Exception as exc:
        err = exc
        detail = describe(exc)
    ctx.add(f"group_describe [{cfg.name}]", OK if err is None else FAIL, since(t0), detail)


async def group_clean_leave(ctx: Ctx, cfg: GroupCfg, first: Member, second: Member) -> None:
    t0 = time.monotonic()
    await stop_member(second)
    stopped = since(t0)
    await wait_until(lambda: first.assigned == {0, 1, 2, 3}, 60, "m1 to get all after m2.stop()")
    detail = f"m2.stop() took {stopped:.2f}s; m1 has [0..3] again"
    ctx.add(f"group_rebalance_on_clean_leave [{cfg.name}]", OK, since(t0), detail)


async def group_killed_member(ctx: Ctx, cfg: GroupCfg, first: Member, spot: Spot) -> None:
    session, hb = str(cfg.session_ms), str(cfg.heartbeat_ms)
    child = await spawn_child(ctx, "member", spot.topic, spot.group_id, session, hb)
    try:
        await child.expect("assigned")
        await wait_until(lambda: len(first.assigned) == 2, 60, "split with child member")
        await asyncio.sleep(cfg.heartbeat_ms / 1000 + 0.2)  # the child has heartbeated
        os.kill(child.pid, signal.SIGKILL)
        took = await wait_until(lambda: first.assigned == {0, 1, 2, 3}, 120, "m1 after SIGKILL")
    finally:
        await child.close()
    detail = (
        f"SIGKILL child member -> m1 has [0..3] after {took:.2f}s "
        f"(session_timeout_ms {cfg.session_ms})"
    )
    ctx.add(f"group_rebalance_on_killed_member [{cfg.name}]", OK, took, detail)


def count_revokes(log: Sequence[str]) -> int:
    return sum(1 for line in log if ".revoked[" in line and ".revoked[]" not in line)


async def probe_paused(ctx: Ctx) -> None:
    """A member whose partitions are all paused keeps polling: does it keep its assignment?"""
    spot = await new_spot(ctx, "paused", 2)
    member = await start_member(ctx, spot, "p1", FAST, max_poll_interval_ms=3000)
    other: Member | None = None
    try:
        await wait_until(lambda: member.assigned == {0, 1}, 60, "p1 assignment")
        await stop_polling(member)
        member.consumer.pause(*member.consumer.assignment())
        await feed(ctx, spot.topic, 2)
        await hold_paused(ctx, member, 2.5 * FAST.session_ms / 1000)
        other = await paused_rebalance(ctx, member, spot)
    finally:
        if other is not None:
            await stop_member(other)
        await stop_member(member)
        ctx.add("paused_callback_log", INFO, since(spot.t0), " | ".join(spot.log))


async def hold_paused(ctx: Ctx, member: Member, hold: float) -> None:
    t0 = time.monotonic()
    revokes = count_revokes(member.log)
    while since(t0) < hold:
        got = await member.consumer.getmany(timeout_ms=500)
        if got:
            raise ProbeFailed(f"paused consumer returned records: {got}")
    kept = member.assigned == {0, 1} and count_revokes(member.log) == revokes
    paused = sorted(tp.partition for tp in member.consumer.paused())
    detail = (
        f"all partitions paused, getmany(timeout_ms=500) loop for {hold:.0f}s "
        f"(2.5x session_timeout_ms=6000, max_poll_interval_ms=3000): no revoke={kept}, "
        f"still assigned {sorted(member.assigned)}, paused={paused}, no records returned"
    )
    ctx.add("paused_member_keeps_assignment", OK if kept else FAIL, since(t0), detail)


async def feed(ctx: Ctx, topic: str, partitions: int) -> None:
    async with running(new_producer(ctx)) as producer:
        for p in range(partitions):
            await producer.send_and_wait(topic, b"x", partition=p)


async def paused_rebalance(ctx: Ctx, member: Member, spot: Spot) -> Member:
    """After a rebalance, are the partitions handed back to a paused member still paused?"""
    member.task = asyncio.create_task(member.run())
    t0 = time.monotonic()
    other = await start_member(ctx, spot, "p2", FAST)
    await wait_until(lambda: len(member.assigned) == 1 and len(other.assigned) == 1, 60, "split")
    paused = sorted(tp.partition for tp in member.consumer.paused())
    held = sorted(member.assigned)
    detail = (
        f"after a rebalance p1 holds {held}, consumer.paused()={paused}: pause state is "
        "NOT kept across a rebalance (re-pause in on_partitions_assigned)"
        if not paused
        else f"after a rebalance p1 holds {held}, still paused {paused}"
    )
    ctx.add("paused_state_after_rebalance", INFO, since(t0), detail)
    return other


async def probe_no_poll(ctx: Ctx) -> None:
    """A member that stops calling getmany for longer than max_poll_interval_ms."""
    spot = await new_spot(ctx, "nopoll", 1)
    member = await start_member(ctx, spot, "n1", FAST, max_poll_interval_ms=3000)
    try:
        await wait_until(lambda: member.assigned == {0}, 60, "n1 assignment")
        polls = member.polls
        await wait_until(lambda: member.polls > polls, 10, "a getmany after assignment")
        member.polling = False
        await wait_until(lambda: not member.assigned, 15, "revocation")
        lost = time.monotonic() - member.last_poll
        member.polling = True
        back = await wait_until(lambda: member.assigned == {0}, 30, "rejoin")
    finally:
        await stop_member(member)
    detail = (
        f"max_poll_interval_ms=3000: on_partitions_revoked {lost:.2f}s after the last getmany, "
        f"re-assigned {back:.2f}s after polling resumed; {' | '.join(spot.log)}"
    )
    ctx.add("not_polling_leaves_group", INFO, since(spot.t0), detail)


async def probe_kip848(ctx: Ctx) -> None:
    t0 = time.monotonic()
    try:
        AIOKafkaConsumer(bootstrap_servers=ctx.bootstrap, group_protocol="consumer")
    except TypeError as exc:
        detail = (
            f"AIOKafkaConsumer(group_protocol='consumer') -> {describe(exc)}; classic protocol only"
        )
        ctx.add("kip848_group_protocol", INFO, since(t0), detail)
        return
    ctx.add("kip848_group_protocol", INFO, since(t0), "group_protocol accepted by aiokafka")


# --------------------------------------------------------------------------- partitioner


def java_partitions(jars: str, keys: Sequence[bytes], n: int) -> list[int]:
    source = (
        "import org.apache.kafka.common.utils.Utils;\n"
        "public class Murmur { public static void main(String[] a) {\n"
        " int n = Integer.parseInt(a[0]);\n"
        " for (int i = 1; i < a.length; i++) {\n"
        "  byte[] k = java.util.HexFormat.of().parseHex(a[i]);\n"
        "  System.out.println(Utils.toPositive(Utils.murmur2(k)) % n); } } }\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Murmur.java"
        path.write_text(source)
        argv = ["java", "-cp", f"{jars}/*", str(path), str(n), *(k.hex() for k in keys)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return [int(line) for line in out.stdout.split()]


async def probe_partitioner(ctx: Ctx) -> None:
    n = 6
    topic = await create_topic(ctx, "part", partitions=n)
    rng = random.Random(848)
    keys = [rng.randbytes(rng.randint(1, 24)) for _ in range(17)] + [b"order-1", b"a", b""]
    expected = [(murmur2(k) & 0x7FFFFFFF) % n for k in keys]
    t0 = time.monotonic()
    async with running(new_producer(ctx)) as producer:
        chosen = [(await producer.send_and_wait(topic, b"v", key=k)).partition for k in keys]
    same = chosen == expected
    detail = f"20 keys, {n} partitions: default partitioner == toPositive(murmur2(key)) % n: {same}"
    if ctx.kafka_jars:
        java = await asyncio.to_thread(java_partitions, ctx.kafka_jars, keys, n)
        detail += f"; == Java client Utils.toPositive(Utils.murmur2(key)) % n: {java == chosen}"
        same = same and java == chosen
    ctx.add("partitioner_murmur2", OK if same else FAIL, since(t0), detail)


# --------------------------------------------------------------------------- child processes


@dataclass
class Child:
    proc: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def expect(self, event: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), CHILD_READY_TIMEOUT)
            if not line:
                raise ProbeFailed(f"child exited before {event!r}")
            message: dict[str, Any] = json.loads(line)
            if message.get("event") == "error":
                raise ProbeFailed(f"child: {message['error']}")
            if message.get("event") == event:
                return message

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.kill()
        await asyncio.wait_for(self.proc.wait(), 15)


async def spawn_child(ctx: Ctx, kind: str, *args: str) -> Child:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--bootstrap",
        ctx.bootstrap,
        "--child",
        kind,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    return Child(proc)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def child_member(bootstrap: str, topic: str, group_id: str, session: str, hb: str) -> None:
    consumer = new_consumer(
        bootstrap, group_id=group_id, session_timeout_ms=int(session), heartbeat_interval_ms=int(hb)
    )
    consumer.subscribe([topic])
    await consumer.start()
    while True:
        await consumer.getmany(timeout_ms=200)
        if consumer.assignment():
            emit("assigned", partitions=sorted(tp.partition for tp in consumer.assignment()))


async def child_zombie(bootstrap: str, topic: str, txid: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txid, acks="all")
    async with running(producer):
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"a1-open")
        emit("sent")
        await asyncio.to_thread(sys.stdin.readline)
        send_err = await outcome(producer.send_and_wait(topic, b"a2-zombie"))
        commit_err = await outcome(producer.commit_transaction())
        abort_err = await outcome(producer.abort_transaction())
        results = {"send": send_err, "commit": commit_err, "abort": abort_err}
        emit("result", **{step: describe(err) for step, err in results.items()})


async def child_main(bootstrap: str, argv: Sequence[str]) -> None:
    try:
        if argv[0] == "member":
            await child_member(bootstrap, *argv[1:])
        else:
            await child_zombie(bootstrap, *argv[1:])
    except Exception as exc:
        emit("error", error=describe(exc))


# --------------------------------------------------------------------------- runner


PROBES: dict[str, Callable[[Ctx], Awaitable[None]]] = {
    "protocol": probe_protocol,
    "plain": probe_plain,
    "headers": probe_headers,
    "idempotent": probe_idempotent,
    "transactions": probe_transactions,
    "fencing_between": probe_fencing_between,
    "fencing_zombie": probe_fencing_zombie,
    "abandoned_txn": probe_abandoned_txn,
    "partitioner": probe_partitioner,
    "group_fast": lambda ctx: probe_group(ctx, FAST),
    "group_defaults": lambda ctx: probe_group(ctx, DEFAULTS),
    "paused": probe_paused,
    "no_poll": probe_no_poll,
    "kip848": probe_kip848,
}


async def run_probe(ctx: Ctx, name: str, limit: float) -> None:
    print(f"probe {name} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(PROBES[name](ctx), limit)
    except TimeoutError:
        ctx.add(name, FAIL, since(t0), f"probe timed out after {limit:.0f}s")
    except Exception as exc:
        ctx.add(name, FAIL, since(t0), describe(exc))


async def cleanup(ctx: Ctx) -> None:
    if ctx.topics:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ctx.admin.delete_topics(ctx.topics), 15)


def render(ctx: Ctx) -> str:
    lines = [
        f"### {ctx.label} ({ctx.bootstrap})",
        "",
        "| probe | result | time | details |",
        "| --- | --- | --- | --- |",
    ]
    for row in ctx.rows:
        detail = row.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row.probe} | {row.status} | {row.seconds:.2f}s | {detail} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    admin_client = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap, request_timeout_ms=15000)
    await asyncio.wait_for(admin_client.start(), 20)
    ctx = Ctx(
        args.bootstrap, args.label or args.bootstrap, admin_client, kafka_jars=args.kafka_jars
    )
    names = args.only.split(",") if args.only else list(PROBES)
    try:
        for name in names:
            await run_probe(ctx, name, args.probe_timeout)
    finally:
        await cleanup(ctx)
        await admin_client.close()
    print(render(ctx))
    return 0 if all(row.status != FAIL for row in ctx.rows) else 1


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap", default="127.0.0.1:29092")
    parser.add_argument("--label", default="")
    parser.add_argument("--only", default="", help="comma-separated probe names")
    parser.add_argument("--list", action="store_true", help="print probe names and exit")
    parser.add_argument("--probe-timeout", type=float, default=150.0)
    parser.add_argument(
        "--kafka-jars",
        default=None,
        help="folder with kafka-clients and slf4j jars: also compare with the Java partitioner",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        print("\n".join(PROBES))
        return 0
    if args.child:
        asyncio.run(child_main(args.bootstrap, args.child))
        return 0
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
