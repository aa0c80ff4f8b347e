"""How fast the console's overview answers with a large outbox: 64 partitions, a 1M-record
backlog on PostgreSQL, two relay members owning the partitions and an inbox with lag.

Starts an embedded PostgreSQL and a Kafka broker (or uses ``--database-url`` and
``--bootstrap``), writes the backlog with one ``INSERT … SELECT`` (the rows the writer would
insert: a key per 1,000 rows, a 300-byte value), makes two members of the relay group own the
partitions (plain consumers of the group: the overview reads the group, they publish
nothing), then times ``GET /`` of the console served by uvicorn, over HTTP:

- the page: each request finds the last read stale, starts a new one and answers from the
  last read at once (what every refresh of a watched page does);
- a read of the figures, which runs beside (the backlog query, the group, the end offsets,
  the inbox's offsets);
- the backlog query alone, and its plan (``EXPLAIN (ANALYZE, BUFFERS)``);
- beside them, Kafka alone: one-record transactions of one transactional producer (the floor
  under anything that talks to Kafka, as ``bench/relay.py idle`` prints it).

    python bench/console.py                    # 1M records, 64 partitions
    python bench/console.py --records 100000 --requests 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import uvicorn
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.backends import backend_for
from outboxkit.console import ConsoleSettings, console
from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.embedded._process import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kafka_io import one_record_transactions

TOPIC = "bench.orders"
INBOX_TOPIC = "bench.payments"
RELAY = "bench"


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(values) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


async def _fill(url: str, records: int, partitions: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO outboxkit.topics (topic, partitions) VALUES (%s, %s)",
            (TOPIC, partitions),
        )
        await conn.execute(
            """
            INSERT INTO outboxkit.outbox (topic, partition, key, value, event_id, event_type)
            SELECT %s, (i / 1000) %% %s, convert_to('key-' || (i / 1000), 'UTF8'),
                   convert_to(repeat('x', 300), 'UTF8'), gen_random_uuid(), 'bench.order'
            FROM generate_series(0, %s - 1) AS i
            """,
            (TOPIC, partitions, records),
        )
        await conn.execute("VACUUM ANALYZE outboxkit.outbox")


async def _topics(bootstrap: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, partitions, 1), NewTopic(INBOX_TOPIC, 8, 1)])
    finally:
        await admin.close()


async def _inbox_with_lag(bootstrap: str) -> None:
    """10,000 records on the inbox's topic, the group's offsets committed half-way."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for i in range(10_000):
            await producer.send(INBOX_TOPIC, b"{}", key=f"k{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        INBOX_TOPIC,
        bootstrap_servers=bootstrap,
        group_id="outboxkit.inbox.bench",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen = 0
        while seen < 5_000:
            batches = await consumer.getmany(timeout_ms=1000, max_records=500)
            seen += sum(len(records) for records in batches.values())
        await consumer.commit()
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def _members(bootstrap: str, count: int) -> Any:
    """``count`` members of the relay's group, owning the topic's partitions between them."""
    members = [
        AIOKafkaConsumer(
            TOPIC,
            bootstrap_servers=bootstrap,
            group_id=f"outboxkit.relay.{RELAY}",
            client_id=f"bench-relay-{i}",
            enable_auto_commit=False,
        )
        for i in range(count)
    ]
    for member in members:
        await member.start()
    try:
        for member in members:
            member.pause(*member.assignment())
        # Until the group settled: every partition assigned.
        deadline = time.monotonic() + 60
        while sum(len(m.assignment()) for m in members) < 64 and time.monotonic() < deadline:
            await asyncio.gather(*(m.getmany(timeout_ms=200) for m in members))
        yield members
    finally:
        for member in members:
            await member.stop()


async def _backlog_alone(url: str, calls: int) -> tuple[list[float], str]:
    settings = ConsoleSettings(database_url=url)
    async with backend_for(url).outbox_storage(settings) as storage:
        await storage.backlog()
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await storage.backlog()
            times.append(time.perf_counter() - started)
    query = storage.queries["backlog"]  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query)
        plan = "\n".join(row[0] for row in await cur.fetchall())
    return times, plan


async def wait_until_started(server: uvicorn.Server) -> None:
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace, url: str, bootstrap: str) -> None:
    started = time.monotonic()
    await backend_for(url).migrate(connect_timeout=10)
    await _topics(bootstrap, args.partitions)
    await _fill(url, args.records, args.partitions)
    await _inbox_with_lag(bootstrap)
    print(f"filled {args.records:,} records in {time.monotonic() - started:.0f} s")
    settings = ConsoleSettings(
        database_url=url,
        kafka_bootstrap_servers=[bootstrap],
        topics=[TOPIC],
        relay_name=RELAY,
        console_inboxes=[f"bench:{INBOX_TOPIC}"],
    )
    app = console(settings=settings)
    overview = app.state.console.overview
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    async with (
        _members(bootstrap, 2),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        await wait_until_started(server)
        first = await client.get("/")  # opens the pools and clients
        assert first.status_code == 200, first.text[:500]
        assert f'data-partition="{TOPIC}/63"' in first.text or args.partitions != 64
        answers, reads = [], []
        for _ in range(args.requests):
            overview._read_at = 0.0  # stale: this request starts a read (and does not wait)
            t = time.perf_counter()
            answer = await client.get("/")
            answers.append(time.perf_counter() - t)
            assert answer.status_code == 200
            await overview.settled()
            reads.append(overview._snapshot.read_seconds)
        snapshot = overview._snapshot
        members = len(snapshot.relay.members) if snapshot.relay else 0
        print(
            f"overview, {args.partitions} partitions, {snapshot.pending:,} pending, "
            f"{members} relay members, inbox lag {snapshot.lag:,}:"
        )
        print(f"  GET / (the page, from the last read): {_ms(answers)}")
        print(f"  a read of the figures (in the background): {_ms(reads)}")
    server.should_exit = True
    await serving
    times, plan = await _backlog_alone(url, args.requests)
    print(f"  the backlog query alone: {_ms(times)}")
    alone = await one_record_transactions(
        bootstrap, TOPIC, 100, transactional_id="bench-console-floor", pause=0.02
    )
    print(f"Kafka alone, a one-record transaction: {_ms(alone)}")
    print("the backlog query's plan:")
    print("  " + plan.replace("\n", "\n  "))


@contextlib.contextmanager
def _servers(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        url = args.database_url
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url()
        bootstrap = args.bootstrap
        if bootstrap is None:
            bootstrap = stack.enter_context(KafkaCluster(1)).bootstrap_servers
        yield url, bootstrap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--database-url", help="a migrated-or-empty PostgreSQL database")
    parser.add_argument("--bootstrap", help="a Kafka broker (default: an embedded one)")
    args = parser.parse_args()
    with _servers(args) as (url, bootstrap):
        asyncio.run(run(args, url, bootstrap))


if __name__ == "__main__":
    main()
