"""What the strict writer costs per event: :func:`outboxkit.schemas.encode` (which every outbox's
``add()`` calls, inside the caller's transaction) against writing the same record unchecked.

For each model, CPU time per event (``time.process_time``, steadier than wall time on a shared
machine) of three ways to make its record, alternated round by round:

- ``encode``: as the writers call it;
- ``unchecked``: the same record (byte for byte: checked before timing) written the way
  ``encode`` writes it, without any check of what a reader would make of it (what ``encode``
  cost before the writer was strict);
- ``read back``: ``unchecked`` followed by :func:`outboxkit.schemas.encoding.read_back`, the
  reader's validation of the record and the comparison, as if every event were read back (what
  ``encode`` cost before it knew which events need no read-back).

The models: ``flat`` (str, Decimal and int fields, the relay bench's event), ``nested`` (a list of
nested models and a list of str), ``measured`` (floats, a UTC and a naive datetime), ``binary`` (a
``bytes`` field), ``large`` (200 nested lines and 4 KB of text, ~16 KB of JSON), and ``validated``
(``flat`` with a field validator of its own: always read back); ``measured+offset`` is ``measured``
holding a datetime with a UTC offset, read back too.

``--transaction`` then starts an embedded PostgreSQL and times, on one connection, transactions
that insert an order row alone, then the same with ``PostgresOutbox.add`` of a ``flat`` event,
then with a ``read_back`` of its record added (what the transaction cost when every event was
read back): wall time per transaction (p50) and this process's CPU. ``--kafka`` (or
``--bootstrap HOST:PORT``) prints beside them Kafka's one-record transaction, one
transactional producer (an embedded broker is started for ``--kafka``)::

    python bench/encode.py                   # 7 rounds of 3,000 calls each
    python bench/encode.py --rounds 15 --calls 10000
    python bench/encode.py --transaction --kafka

Run it under another checkout's interpreter (its venv, from outside the checkouts) to measure
that version the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from pydantic import BaseModel, field_validator

from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.migrations.postgres import migrate
from outboxkit.relay import PostgresOutbox, PostgresOutboxStorage
from outboxkit.schemas import EncodedEvent, Event, WireHeader, encode
from outboxkit.schemas.encoding import read_back
from outboxkit.schemas.wire import CONTENT_TYPE, DATA_SCHEMA_HEADER, SPEC_VERSION, format_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kafka_io import one_record_transactions

SOURCE = "urn:service:bench"
KAFKA_TOPIC = "bench.encode"


class OrderPlaced(Event, type="bench.order_placed", topic="bench.orders", key_field="customer_id"):
    order_id: str
    customer_id: str
    amount: Decimal
    currency: str
    lines: int
    note: str
    seq: int = 0


class Line(BaseModel):
    sku: str
    quantity: int
    price: Decimal


class OrderShipped(Event, type="bench.order_shipped", topic="bench.orders", key_field="order_id"):
    order_id: str
    lines: list[Line]
    tags: list[str]


class Measured(Event, type="bench.measured", topic="bench.sensors", key_field="sensor"):
    sensor: str
    value: float
    low: float
    high: float
    taken_at: datetime
    received_at: datetime


class Attachment(Event, type="bench.attachment", topic="bench.files", key_field="name"):
    name: str
    content: bytes
    size: int


class Large(Event, type="bench.large", topic="bench.orders", key_field="order_id"):
    order_id: str
    lines: list[Line]
    note: str


class OrderChecked(OrderPlaced, type="bench.order_checked"):
    @field_validator("currency")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()


def _flat(cls: type[OrderPlaced] = OrderPlaced) -> OrderPlaced:
    return cls(
        id=UUID(int=42),
        order_id="order-000000042",
        customer_id="customer-00042",
        amount=Decimal("123.45"),
        currency="EUR",
        lines=3,
        note="gift wrap, leave at the door if nobody answers",
    )


def _nested() -> OrderShipped:
    return OrderShipped(
        order_id="order-000000042",
        lines=[Line(sku=f"sku-{i}", quantity=i + 1, price=Decimal("9.99")) for i in range(3)],
        tags=["gift", "express"],
    )


def _measured(offset: bool = False) -> Measured:
    taken = datetime(2026, 12, 7, 14, 32, 7, 123456, tzinfo=UTC)
    if offset:
        taken = taken.astimezone(timezone(timedelta(hours=1)))
    return Measured(
        sensor="sensor-7",
        value=21.5,
        low=-3.25,
        high=1e10,
        taken_at=taken,
        received_at=datetime(2026, 12, 7, 14, 32, 8),
    )


def _binary() -> Attachment:
    content = b"%PDF-1.7 invoice 42 " * 20
    return Attachment(name="invoice-42.pdf", content=content, size=len(content))


def _large() -> Large:
    return Large(
        order_id="order-000000042",
        lines=[
            Line(sku=f"sku-{i:05d}", quantity=i % 7 + 1, price=Decimal("9.99")) for i in range(200)
        ],
        note="x" * 4096,
    )


MODELS: dict[str, Callable[[], Event]] = {
    "flat": _flat,
    "nested": _nested,
    "measured": _measured,
    "binary": _binary,
    "large": _large,
    "validated": lambda: _flat(OrderChecked),
    "measured+offset": lambda: _measured(offset=True),
}


def unchecked(event: Event, *, source: str) -> EncodedEvent:
    """``event``'s record as ``encode`` writes it, without checking it (the CloudEvents binding
    of outboxkit.schemas.wire, header by header)."""
    headers = [
        (WireHeader.SPEC_VERSION.value, SPEC_VERSION.encode()),
        (WireHeader.ID.value, str(event.id).encode()),
        (WireHeader.SOURCE.value, source.encode()),
        (WireHeader.TYPE.value, event.event_type.encode()),
        (WireHeader.TIME.value, format_time(event.occurred_at).encode()),
        (WireHeader.SCHEMA_VERSION.value, str(event.event_version).encode()),
        (WireHeader.CONTENT_TYPE.value, CONTENT_TYPE.encode()),
        (DATA_SCHEMA_HEADER, event.event_dataschema.encode()),
        *((name, value.encode()) for name, value in event.headers.items()),
    ]
    payload = event.model_dump_json(include=set(event.event_payload_fields), by_alias=True)
    return EncodedEvent(
        topic=event.topic, key=event.key.encode(), value=payload.encode(), headers=tuple(headers)
    )


def read_back_every_time(event: Event, *, source: str) -> EncodedEvent:
    record = unchecked(event, source=source)
    read_back(event, record)
    return record


WAYS: dict[str, Callable[..., EncodedEvent]] = {
    "encode": encode,
    "unchecked": unchecked,
    "read back": read_back_every_time,
}


def cpu_us(way: Callable[..., EncodedEvent], event: Event, calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        way(event, source=SOURCE)
    return (time.process_time() - started) / calls * 1e6


def encode_table(rounds: int, calls: int, models: list[str]) -> None:
    print(f"{rounds} rounds x {calls:,} calls per way; CPU µs per event, medians")
    print(
        f"{'model':16s} {'encode':>8s} {'unchecked':>10s} {'read back':>10s} "
        f"{'encode/unchecked':>17s}"
    )
    for name in models:
        event = MODELS[name]()
        record = encode(event, source=SOURCE)
        if unchecked(event, source=SOURCE) != record:
            raise SystemExit(f"{name}: the unchecked record differs from encode's")
        for way in WAYS.values():
            way(event, source=SOURCE)  # warm: the class's validator and plan are built once
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(rounds):
            for label, way in WAYS.items():
                times[label].append(cpu_us(way, event, calls))
        median = {label: statistics.median(values) for label, values in times.items()}
        print(
            f"{name:16s} {median['encode']:8.1f} {median['unchecked']:10.1f} "
            f"{median['read back']:10.1f} {median['encode'] / median['unchecked']:16.2f}x"
        )


Transaction = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


def transactions(outbox: PostgresOutbox) -> dict[str, Transaction]:
    async def order(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(
            "INSERT INTO bench_orders (customer_id, amount) VALUES (%s, %s)",
            ("customer-00042", Decimal("123.45")),
        )

    async def alone(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.transaction():
            await order(conn)

    async def add(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.transaction():
            await order(conn)
            await outbox.add(conn, _flat())

    async def add_read_back(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.transaction():
            await order(conn)
            event = _flat()
            await outbox.add(conn, event)
            read_back(event, encode(event, source=SOURCE))  # the part add() skips

    return {"order alone": alone, "+ add": add, "+ add, read back": add_read_back}


async def transaction_table(url: str, rounds: int, count: int, bootstrap: str | None) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_orders (id bigint GENERATED ALWAYS AS IDENTITY "
            "PRIMARY KEY, customer_id text NOT NULL, amount numeric(12, 2) NOT NULL)"
        )
    async with PostgresOutboxStorage(url, pool_size=1) as storage:
        await storage.register_topics({"bench.orders": 16})
    ways = transactions(PostgresOutbox(source=SOURCE))
    wall: dict[str, list[float]] = {label: [] for label in ways}
    cpu: dict[str, list[float]] = {label: [] for label in ways}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for run in ways.values():
            await run(conn)  # warm
        for _ in range(rounds):
            for label, run in ways.items():
                await conn.execute("TRUNCATE bench_orders, outboxkit.outbox")
                for _ in range(count):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    await run(conn)
                    wall[label].append(time.perf_counter() - started)
                    cpu[label].append(time.process_time() - cpu_started)
    print(
        f"\nA writer's transaction on PostgreSQL (embedded, default settings, one connection): "
        f"{rounds} rounds x {count:,} each"
    )
    print(f"{'transaction':24s} {'wall p50 µs':>12s} {'CPU µs':>8s}")
    for label in ways:
        print(
            f"{label:24s} {statistics.median(wall[label]) * 1e6:12.0f} "
            f"{statistics.fmean(cpu[label]) * 1e6:8.0f}"
        )
    if bootstrap is not None:
        times = await kafka_alone(bootstrap, count)
        print(f"{'Kafka, a one-record txn':24s} {statistics.median(times) * 1e6:12.0f}")


async def kafka_alone(bootstrap: str, transactions: int) -> list[float]:
    """Wall time of one-record transactions of one transactional producer (the first 10 warm
    up), as bench/console.py measures it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(KAFKA_TOPIC, 1, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()
    return await one_record_transactions(
        bootstrap, KAFKA_TOPIC, transactions, transactional_id="bench-encode-floor"
    )


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[tuple[str, str | None]]:
    with contextlib.ExitStack() as stack:
        url = args.database_url or stack.enter_context(EmbeddedPostgres()).url()
        bootstrap = args.bootstrap
        if bootstrap is None and args.kafka:
            bootstrap = stack.enter_context(KafkaCluster(1)).bootstrap_servers
        yield url, bootstrap


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="rounds, each way once per round")
    p.add_argument("--calls", type=int, default=3000, help="calls per way and round")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    p.add_argument("--transaction", action="store_true", help="also time a writer's transaction")
    p.add_argument("--transactions", type=int, default=500, help="transactions per way and round")
    p.add_argument("--database-url", help="an empty PostgreSQL database (default: embedded)")
    p.add_argument("--kafka", action="store_true", help="start a broker: Kafka's transaction")
    p.add_argument("--bootstrap", help="a Kafka broker for Kafka's transaction")
    args = p.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    encode_table(args.rounds, args.calls, models)
    if args.transaction:
        with servers(args) as (url, bootstrap):
            asyncio.run(transaction_table(url, args.rounds, args.transactions, bootstrap))


if __name__ == "__main__":
    main()
