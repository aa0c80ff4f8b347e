"""Probes of the protocol versions aiokafka negotiates, and of plain produce/consume: acks=all,
null keys and values, headers, the idempotent producer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from aiokafka.conn import create_conn
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

from bench.broker_probes.harness import (
    FAIL,
    OK,
    Ctx,
    create_topic,
    describe,
    new_producer,
    outcome,
    read_until,
    running,
    show,
    since,
    stop_quietly,
)
from outboxkit.core import kafka_internals

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
    ours = kafka_internals.request_versions(request)
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
    try:
        offered = await conn.send(admin.ApiVersionRequest())
    finally:
        conn.close()
    broker = {key: (low, high) for key, low, high in offered.api_versions}
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
        pid = kafka_internals.producer_id(producer)
    finally:
        await stop_quietly(producer)
    read = await read_until(ctx, topic, b"END")
    want = [f"{i}".encode() for i in range(200)] + [b"END"]
    status = OK if read.values == want else FAIL
    detail = f"producer_id={pid}, init {init:.2f}s, 200 pipelined sends in order, no duplicates"
    ctx.add("idempotent_producer", status, since(t0), detail if status == OK else show(read.values))
