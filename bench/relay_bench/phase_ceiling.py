"""Phase ``ceiling``: what raw aiokafka reaches with the relay's record on this machine.

Plain pipelined sends (``acks=all``, windows of ``--ceiling-window``), and transactional
producers committing every ``--txn-batch`` records: one per partition (all at once, then two at
once), and one producer whose transactions span every partition (the relay's mode with blocks).
The drain phase is compared with these figures, measured in the same run. The producers use
the listener the relays use (``--kafka-security``; over SASL_SSL they log in as the admin user),
so each protocol's drain is compared with its own ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.relay_bench.harness import (
    CEILING_TOPIC,
    SOURCE,
    CpuMeter,
    Ctx,
    Result,
    ensure_topic,
    make_event,
    record_size,
    say,
    transactional_producer,
)
from outboxkit.schemas import EncodedEvent, encode, partition_for_key


@dataclass(frozen=True)
class Rec:
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    partition: int


def ceiling_records(args: argparse.Namespace, count: int = 2000) -> list[Rec]:
    rng = random.Random(7)
    records = []
    for _ in range(count):
        wire = encode(make_event(rng, args.keys, CEILING_TOPIC), source=SOURCE)
        part = partition_for_key(wire.key, args.partitions)
        records.append(Rec(wire.key, wire.value, wire.headers, part))
    return records


async def _send(producer: AIOKafkaProducer, rec: Rec) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = await producer.send(
        CEILING_TOPIC, rec.value, key=rec.key, partition=rec.partition, headers=list(rec.headers)
    )
    return future


async def ceiling_plain(ctx: Ctx, records: list[Rec]) -> float:
    producer = AIOKafkaProducer(
        **ctx.security.client_options(), acks="all", linger_ms=0, client_id="bench-ceiling"
    )
    await producer.start()
    try:
        window, total = ctx.args.ceiling_window, ctx.args.ceiling_records
        source = itertools.cycle(records)
        # Warm-up: metadata, connections.
        await asyncio.gather(*[await _send(producer, next(source)) for _ in range(window)])
        start = time.perf_counter()
        sent = 0
        while sent < total:
            n = min(window, total - sent)
            await asyncio.gather(*[await _send(producer, next(source)) for _ in range(n)])
            sent += n
        return float(total) / (time.perf_counter() - start)
    finally:
        await producer.stop()


async def ceiling_transactional(ctx: Ctx, records: list[Rec], concurrency: int) -> float:
    """One transactional producer per partition, ``txn_batch`` records per transaction, at most
    ``concurrency`` partitions with an open transaction at a time."""
    parts = ctx.args.partitions
    by_part = {p: [r for r in records if r.partition == p] or records[:1] for p in range(parts)}
    producers = {p: transactional_producer(ctx, f"ceiling-{concurrency}-{p}") for p in range(parts)}
    await asyncio.gather(*(pr.start() for pr in producers.values()))
    batch = ctx.args.txn_batch
    per_part = max(batch, ctx.args.ceiling_records // parts // batch * batch)
    gate = asyncio.Semaphore(concurrency)

    async def one_txn(p: int, source: Iterable[Rec]) -> None:
        producer = producers[p]
        async with gate:
            await producer.begin_transaction()
            futures = [await _send(producer, rec) for rec in itertools.islice(source, batch)]
            await asyncio.gather(*futures)
            await producer.commit_transaction()

    async def run(p: int, transactions: int) -> None:
        source = itertools.cycle(by_part[p])
        for _ in range(transactions):
            await one_txn(p, source)

    try:
        await asyncio.gather(*(run(p, 1) for p in range(parts)))  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(run(p, per_part // batch) for p in range(parts)))
        return float(per_part * parts) / (time.perf_counter() - start)
    finally:
        await asyncio.gather(*(pr.stop() for pr in producers.values()))


async def ceiling_one_producer(ctx: Ctx, records: list[Rec]) -> float:
    """One transactional producer, ``txn_batch`` records per transaction across every partition
    (a relay that owns all partitions publishes them as one block)."""
    producer = transactional_producer(ctx, "ceiling-block", max_batch_size=1024 * 1024)
    await producer.start()
    batch = ctx.args.txn_batch
    source = itertools.cycle(records)

    async def one_txn() -> None:
        await producer.begin_transaction()
        futures = [await _send(producer, rec) for rec in itertools.islice(source, batch)]
        await asyncio.gather(*futures)
        await producer.commit_transaction()

    try:
        await one_txn()  # warm-up
        transactions = max(1, ctx.args.ceiling_records // batch)
        start = time.perf_counter()
        for _ in range(transactions):
            await one_txn()
        return float(transactions * batch) / (time.perf_counter() - start)
    finally:
        await producer.stop()


async def phase_ceiling(ctx: Ctx) -> None:
    args = ctx.args
    await ensure_topic(ctx, CEILING_TOPIC, args.partitions)
    records = ceiling_records(args)
    size = statistics.mean(
        record_size(EncodedEvent(CEILING_TOPIC, r.key, r.value, r.headers)) for r in records
    )
    say(
        f"record: {size:.0f} bytes (key {len(records[0].key)}, value {len(records[0].value)}, "
        f"{len(records[0].headers)} headers), {args.partitions} partitions, "
        f"{args.ceiling_records} records per case"
    )
    bench = {"bench": [os.getpid()]}
    snap = ctx.cpu.snapshot(bench)
    plain = await ceiling_plain(ctx, records)
    after = ctx.cpu.snapshot(bench)
    cpu_note = CpuMeter.describe(snap, after)
    # CPU per record, the warm-up window included: what TLS costs the client and the broker,
    # however busy the machine is.
    sent = args.ceiling_records + args.ceiling_window
    for group in ("bench", "kafka"):
        ctx.figures[f"ceiling {group} cpu"] = snap.seconds(after, group) * 1000 / sent
    cpu_note += (
        f"; CPU per record: aiokafka {ctx.figures['ceiling bench cpu'] * 1000:.1f} µs, "
        f"broker {ctx.figures['ceiling kafka cpu'] * 1000:.1f} µs"
    )
    say(f"plain, window {args.ceiling_window}: {plain:,.0f} records/s; {cpu_note}")
    ctx.ceiling_plain = plain
    ctx.add(
        Result(
            "ceiling",
            f"plain acks=all, window {args.ceiling_window}",
            f"{plain:,.0f} rec/s",
            note=cpu_note,
        )
    )
    cases: list[tuple[str, Any]] = [
        (
            f"txn/partition, {args.txn_batch}/commit, {c} partitions at once",
            lambda c=c: ceiling_transactional(ctx, records, c),
        )
        for c in sorted({args.partitions, 2}, reverse=True)
    ]
    cases.append(
        (
            f"one txn over all partitions, {args.txn_batch}/commit",
            lambda: ceiling_one_producer(ctx, records),
        )
    )
    for label, run in cases:
        snap = ctx.cpu.snapshot(bench)
        txn = await run()
        cpu_note = CpuMeter.describe(snap, ctx.cpu.snapshot(bench))
        say(f"{label}: {txn:,.0f} records/s; {cpu_note}")
        if label.startswith(f"txn/partition, {args.txn_batch}/commit, {args.partitions} "):
            ctx.ceiling_txn = txn
        ctx.add(
            Result("ceiling", label, f"{txn:,.0f} rec/s", f"{txn / plain:.2f}x plain", cpu_note)
        )
