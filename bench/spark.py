"""Spark pipeline throughput: a backlog of OrderPlaced events through the example pipeline
(available-now, local[2]) against the ceiling (raw aiokafka consumption of the same topic).

    python bench/spark.py [--events 50000] [--partitions 4] [--master local[2]]

Starts its own PostgreSQL and one Apache Kafka node (or uses --postgres URL / --kafka HOST:PORT).
The pipeline runs its three queries (quarantine, order totals → Parquet, order totals →
PostgreSQL), each reading the whole topic; "events/s" is backlog size / wall time of the run
(SparkSession start-up excluded and printed separately). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.demo.events import Currency, OrderLine, OrderPlaced
from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.embedded.kafka import kafka_jars_dir
from outboxkit.migrations import migrate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kafka_io import consume_rate, produce_events


async def _produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, partitions, 1)])
    await admin.close()
    await produce_events(bootstrap, _orders(topic, count), linger_ms=20)


def _orders(topic: str, count: int) -> Iterator[OrderPlaced]:
    """``count`` orders of 1000 customers, event times a few minutes out of order."""
    rng = random.Random(1)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(count):
        price = Decimal(rng.randrange(100, 5000)) / 100
        yield OrderPlaced(
            topic=topic,
            occurred_at=start + timedelta(seconds=i * 3 + rng.randrange(600)),
            order_id=f"o-{i}",
            customer_id=f"c-{rng.randrange(1000)}",
            currency=Currency.EUR,
            lines=[OrderLine(sku="s", quantity=2, unit_price=price)],
            amount=price * 2,
        )


@contextlib.contextmanager
def _servers(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        pg = args.postgres or stack.enter_context(EmbeddedPostgres(workdir / "pg")).url()
        kafka = args.kafka or (
            stack.enter_context(
                KafkaCluster(1, jars_dir=kafka_jars_dir(), base_dir=workdir / "kafka")
            ).bootstrap_servers
        )
        yield pg, kafka


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--postgres", help="use this PostgreSQL (superuser URL)")
    parser.add_argument("--kafka", help="use this Kafka cluster (host:port)")
    args = parser.parse_args()

    from outboxkit.inbox.spark import PipelineSettings  # noqa: PLC0415
    from outboxkit.inbox.spark.pipeline import build_session, run_pipeline  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="outboxkit-bench-spark-") as tmp:
        workdir = Path(tmp)
        with _servers(args, workdir) as (pg_url, bootstrap):
            asyncio.run(_migrate(pg_url))
            topic = f"bench.orders-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            asyncio.run(_produce(bootstrap, topic, args.events, args.partitions))
            print(f"produced {args.events} events in {time.perf_counter() - started:.1f} s")
            ceiling = asyncio.run(consume_rate(bootstrap, topic, args.events))
            print(f"ceiling (aiokafka, read_committed): {ceiling:,.0f} events/s")

            settings = PipelineSettings(
                kafka_bootstrap_servers=bootstrap,
                topics=topic,
                database_url=pg_url,
                pipeline_name="bench",
                pipeline_output=str(workdir / "lake"),
                spark_master=args.master,
            )
            started = time.perf_counter()
            spark = build_session(settings)
            spark.sparkContext.setLogLevel("ERROR")
            print(f"SparkSession start: {time.perf_counter() - started:.1f} s ({args.master})")
            started = time.perf_counter()
            reports = run_pipeline(settings, spark=spark)
            elapsed = time.perf_counter() - started
            for r in reports:
                print(f"  {r.name}: {r.batches} batches, {r.input_rows} rows")
            print(
                f"pipeline (3 queries, available-now): {elapsed:.1f} s, "
                f"{args.events / elapsed:,.0f} events/s = {args.events / elapsed / ceiling:.2f}x "
                "the ceiling"
            )
            with psycopg.connect(pg_url) as conn:
                row = conn.execute("SELECT sum(orders) FROM shop_order_totals").fetchone()
            print(f"serving table counts {row[0] if row else 0} orders")
            spark.stop()


if __name__ == "__main__":
    main()
