"""Phase ``writer`` on MongoDB: what ``MongoOutbox.add`` costs a writer's transaction.

``--mongo-writers`` asyncio tasks on one AsyncMongoClient (a service's pool), each running
transactions back to back for ``--mongo-writer-seconds``, ``--mongo-writer-rounds`` rounds
alternating the variants. Every transaction runs in :func:`outboxkit.core.mongodb.in_transaction`
(majority write concern, retried on a write conflict): (a) the business insert of an order alone;
(b) the same plus ``MongoOutbox.add`` of its event (topics read, key position, outbox insert).
Collections emptied before each round. Per variant: transactions/s and mongod CPU per transaction
(medians of the rounds), and (b)/(a) against #27's target (≤ 1.3x). Then a backlog of
``--mongo-backlog`` events written by the same tasks three ways (:data:`BACKLOG_SHAPES`), each
outboxkit shape's events/s against a plain one-insert-per-event transaction's (#27: ≥ 1x).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bson import Binary, Decimal128
from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession

from bench.relay_bench.harness import SOURCE, Ctx, OrderPlaced, Result, make_event, say
from bench.relay_bench.outbox_mongodb import MongoBenchOutbox, database_url
from outboxkit.core.mongodb import Client, collection, in_transaction
from outboxkit.migrations.mongodb import migrate
from outboxkit.relay import MongoOutbox, StorageUnavailableError
from outboxkit.schemas import encode

WRITER_DB = "outboxkit_bench_writer"
WRITER_TOPIC = "bench.orders"
ORDERS = "bench_orders"
#: #27's target: the outbox write costs at most this much over the business transaction.
TARGET = 1.3

VARIANTS = {"a": "business insert alone", "b": "business insert + MongoOutbox.add"}
#: Events per transaction of the backlog's add_many shape.
BACKLOG_BATCH = 100

Work = Callable[[AsyncClientSession, OrderPlaced], Awaitable[None]]


def order_document(event: OrderPlaced) -> dict[str, Any]:
    return {
        "order_id": event.order_id,
        "customer_id": event.customer_id,
        "amount": Decimal128(event.amount),
        "currency": event.currency,
        "lines": event.lines,
        "note": event.note,
    }


def variant_work(client: Client, outbox: MongoOutbox | None) -> Work:
    orders = client.get_database(WRITER_DB).get_collection(ORDERS)

    async def work(session: AsyncClientSession, event: OrderPlaced) -> None:
        await orders.insert_one(order_document(event), session=session)
        if outbox is not None:
            await outbox.add(session, event)

    return work


async def run_round(client: Client, work: Work, writers: int, seconds: float, keys: int) -> int:
    """Transactions committed by ``writers`` tasks in ``seconds``."""
    deadline = time.monotonic() + seconds

    async def writer(seed: int) -> int:
        rng, done = random.Random(seed), 0
        while time.monotonic() < deadline:
            event = make_event(rng, keys, WRITER_TOPIC)

            async def txn(session: AsyncClientSession, event: OrderPlaced = event) -> None:
                await work(session, event)

            await in_transaction(client, txn, unavailable=StorageUnavailableError)
            done += 1
        return done

    return sum(await asyncio.gather(*(writer(i) for i in range(writers))))


#: How a backlog of events is written: a plain document per event, one per transaction (what a
#: writer without outboxkit does); ``MongoOutbox.add``, one per transaction; ``add_many``, 100
#: per transaction.
BACKLOG_SHAPES = {
    "plain": "plain insert, 1 event/txn",
    "add": "MongoOutbox.add, 1 event/txn",
    "add_many": f"MongoOutbox.add_many, {BACKLOG_BATCH} events/txn",
}


BacklogWork = Callable[..., Awaitable[None]]


def plain_document(event: OrderPlaced) -> dict[str, Any]:
    """``event`` as a writer without outboxkit stores it: no partition, no position."""
    wire = encode(event, source=SOURCE)
    return {
        "topic": wire.topic,
        "key": wire.key,
        "value": wire.value,
        "headers": [[name, value] for name, value in wire.headers],
        "event_id": Binary.from_uuid(event.id),
        "created_at": datetime.now(UTC),
    }


def backlog_work(shape: str, outbox: MongoOutbox, plain: Any) -> BacklogWork:
    """One transaction's work of a backlog ``shape`` (:data:`BACKLOG_SHAPES`)."""

    async def insert_plain(session: AsyncClientSession, events: list[OrderPlaced]) -> None:
        for event in events:
            await plain.insert_one(plain_document(event), session=session)

    async def add(session: AsyncClientSession, events: list[OrderPlaced]) -> None:
        await outbox.add_many(session, events)

    return insert_plain if shape == "plain" else add


async def write_backlog(
    ctx: Ctx, client: Client, outbox: MongoOutbox, db: Any, writers: int
) -> None:
    """#27: a backlog of ``--mongo-backlog`` events written at least as fast as a plain
    one-insert-per-event transaction writes it. Each shape by ``writers`` tasks, the events
    split among them; seconds and events/s, and each outboxkit shape against the plain one."""
    events_total = ctx.args.mongo_backlog
    plain = db.get_collection("bench_plain_events")
    rates: dict[str, float] = {}
    share = events_total // writers
    for shape, label in BACKLOG_SHAPES.items():
        await plain.delete_many({})
        await collection(db, "outbox").delete_many({})
        per_txn = BACKLOG_BATCH if shape == "add_many" else 1
        work = backlog_work(shape, outbox, plain)

        async def writer(seed: int, work: BacklogWork = work, per_txn: int = per_txn) -> None:
            rng = random.Random(seed)
            for _ in range(share // per_txn):
                events = [make_event(rng, ctx.args.keys, WRITER_TOPIC) for _ in range(per_txn)]
                await in_transaction(
                    client,
                    functools.partial(work, events=events),
                    unavailable=StorageUnavailableError,
                )

        start = time.perf_counter()
        await asyncio.gather(*(writer(1000 + i) for i in range(writers)))
        seconds = time.perf_counter() - start
        rates[shape] = share * writers / seconds
        say(
            f"  backlog of {share * writers:,} events, {label}: {seconds:.1f} s, "
            f"{rates[shape]:,.0f} events/s"
        )
    for shape in ("add", "add_many"):
        ratio = rates[shape] / rates["plain"]
        verdict = "met" if ratio >= 1 else "NOT met"
        ctx.add(
            Result(
                "writer",
                f"backlog {events_total:,}: {BACKLOG_SHAPES[shape]} / plain",
                f"{rates[shape]:,.0f} / {rates['plain']:,.0f} events/s",
                f"{ratio:.2f}x",
                f"target ≥ 1x the plain one-insert-per-event transaction (#27): {verdict}",
            )
        )


async def aborted(client: Client) -> int:
    status: dict[str, Any] = await client.admin.command({"serverStatus": 1})
    return int(status["transactions"]["totalAborted"])


async def phase_writer_mongodb(ctx: Ctx) -> None:
    args = ctx.args
    if not isinstance(ctx.outbox, MongoBenchOutbox):
        raise RuntimeError("this phase measures MongoDB itself")
    writers, seconds, rounds = (
        args.mongo_writers,
        args.mongo_writer_seconds,
        args.mongo_writer_rounds,
    )
    client: Client = AsyncMongoClient(
        database_url(ctx.outbox.url, WRITER_DB),
        uuidRepresentation="standard",
        tz_aware=True,
        appname="bench-writer",
        maxPoolSize=writers,
    )
    measured = "mongodb" in ctx.cpu.roots
    tps: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    aborts: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    try:
        await client.drop_database(WRITER_DB)
        db = client.get_database(WRITER_DB)
        await migrate(db)
        await collection(db, "topics").update_one(
            {"_id": WRITER_TOPIC}, {"$set": {"partitions": args.partitions}}, upsert=True
        )
        outbox = MongoOutbox(source=SOURCE, database=WRITER_DB)
        works = {"a": variant_work(client, None), "b": variant_work(client, outbox)}
        say(
            f"{writers} writer tasks on one AsyncMongoClient, {rounds} rounds x {seconds:g} s "
            f"alternating a b, {args.keys} keys; collections emptied before each round"
        )
        for round_no in range(1, rounds + 1):
            for variant, label in VARIANTS.items():
                await db.get_collection(ORDERS).delete_many({})
                await collection(db, "outbox").delete_many({})
                aborted_before = await aborted(client)
                before = ctx.cpu.snapshot({"bench": [os.getpid()]})
                done = await run_round(client, works[variant], writers, seconds, args.keys)
                after = ctx.cpu.snapshot({"bench": [os.getpid()]})
                aborts[variant] += await aborted(client) - aborted_before
                rate = done / (after.at - before.at)
                per = before.seconds(after, "mongodb") * 1000 / max(done, 1)
                tps[variant].append(rate)
                cpu_ms[variant].append(per)
                bench_ms = before.seconds(after, "bench") * 1000 / max(done, 1)
                cpu = f"mongod {per:.3f} ms/txn, " if measured else ""
                say(
                    f"  round {round_no} ({variant}) {label}: {rate:,.0f} txn/s, {cpu}"
                    f"bench {bench_ms:.3f} ms/txn"
                )
        await write_backlog(ctx, client, outbox, db, writers)
    finally:
        await client.close()
    median = {v: statistics.median(tps[v]) for v in VARIANTS}
    cpu_median = {v: statistics.median(cpu_ms[v]) for v in VARIANTS}
    for variant, label in VARIANTS.items():
        spread = f"{min(tps[variant]):,.0f}-{max(tps[variant]):,.0f}"
        cpu = f"mongod {cpu_median[variant]:.3f} ms CPU/txn" if measured else "mongod CPU n/a"
        ctx.add(
            Result(
                "writer",
                f"({variant}) {label}",
                f"{median[variant]:,.0f} txn/s; {cpu}",
                f"{median['a'] / median[variant]:.2f}x slower than (a)",
                f"median of {rounds} rounds {spread}; {aborts[variant]} aborted txns",
            )
        )
    slower = median["a"] / median["b"]
    cpu_ratio = cpu_median["b"] / cpu_median["a"] if measured and cpu_median["a"] else None
    cpu_text = f"mongod CPU/txn {cpu_ratio:.2f}x" if cpu_ratio is not None else "CPU n/a"
    verdict = "met" if slower <= TARGET and (cpu_ratio or 0) <= TARGET else "NOT met"
    say(f"  (b)/(a): throughput cost {slower:.2f}x, {cpu_text}; target ≤ {TARGET}x: {verdict}")
    ctx.add(
        Result(
            "writer",
            "(b)/(a) outbox write overhead",
            f"throughput {slower:.2f}x, {cpu_text}",
            f"{slower:.2f}x",
            f"target ≤ {TARGET}x (#27): {verdict}",
        )
    )
