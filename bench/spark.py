"""Spark pipeline figures, one run on local[2]: raw Kafka source read rate, the pipeline's
throughput into each sink and its ratio to the raw rate, SparkSession start, and 1M events end
to end with a driver killed mid-stream, checked against a batch recount.

    python bench/spark.py [--events 1000000] [--partitions 4] [--master local[2]]
    python bench/spark.py --events 300000 --phases compare --rounds 3   # issue #42: three jobs

Starts its own PostgreSQL and one Apache Kafka node (or uses --postgres URL / --kafka HOST:PORT)
and produces ``--events`` OrderPlaced events (1,000 customers). Phases, all on the same topic:

1. raw: ``count()`` of a batch ``kafka`` source (read_committed, headers), no decode;
   then a warm-up (``--warmup`` records decoded, deduplicated and totalled by a batch query),
   so that the first pipeline phase does not pay for the JIT alone;
2. the demo's job (``outboxkit.demo.pipeline``), available-now with 100K records per
   micro-batch, into PostgreSQL only, into Delta only, into both: events/s = backlog / wall
   time of the run, and the ratio to (1); the CPU time of Spark's JVM and Python workers per
   event (robust on a shared machine, unlike wall time); where the micro-batches' time went
   (Spark's ``durationMs`` per batch, and ``addBatch`` per step: the quarantine sink, whose
   first read also reads, decodes and deduplicates the batch, then each sink);
3. compare: the pipeline against the job a data engineer writes by hand instead (issue #31):
   ``readStream.format("kafka")`` → ``from_json(value::string, <OrderPlaced payload schema>)``
   → ``foreachBatch(df.write.jdbc(..., mode="append"))`` with Spark's default JDBC options (no
   validation, no dedupe, no quarantine), and the demo's job into PostgreSQL only; both
   available-now with the same records per micro-batch on fresh checkpoints and tables, order
   alternated, ``--rounds`` rounds; and (issue #42) the same-work hand-written job, which gives
   itself the pipeline's guarantees in plain Spark SQL (bench/spark_same_work.py); prints each
   run's events/s and Spark's CPU per event, then the three-job table: warm medians (the first
   round, which warms the JVM up, in brackets) and the ratios to both hand-written jobs, round by
   round. ``--jobs`` adds diagnostic variants to each round (``pipeline:no-dedupe``,
   ``same-work:no-dedupe``… see ``JOB_VARIANTS``), to price each part against its twin;
4. kill/restart: the same job as ``python -m outboxkit.pipeline run`` with a 1 s trigger and
   100K records per batch, SIGKILLed after two committed batches, then resumed from its
   checkpoint (available-now); both sinks are compared with a batch recount of the distinct
   valid events (Kafka → decode → dropDuplicates → the same totals).
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.demo.events import Currency, OrderLine, OrderPlaced
from outboxkit.embedded import EmbeddedPostgres, KafkaCluster
from outboxkit.embedded.kafka import kafka_jars_dir
from outboxkit.migrations.postgres import migrate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kafka_io import produce_events
from bench.spark_compare import (
    JOB_VARIANTS,
    Compare,
    breakdown,
    compare_phase,
    jdbc_driver,
    tree_cpu,
)


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


def _pg_totals(url: str, table: str) -> dict[tuple[Any, ...], int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT window_start, customer_id, currency, orders FROM {table}"
        ).fetchall()
    return {(r[0], r[1], r[2]): r[3] for r in rows}


def _frame_totals(frame: Any) -> dict[tuple[Any, ...], int]:
    rows = frame.select("window_start", "customer_id", "currency", "orders").toArrow()
    return {
        (r["window_start"], r["customer_id"], r["currency"]): r["orders"] for r in rows.to_pylist()
    }


PHASES = ("postgresql", "delta", "both", "compare", "kill")
#: Records per micro-batch (``pipeline_max_offsets_per_trigger``) unless --setting says otherwise.
BATCH = 100_000
#: Records of the warm-up (the JIT compiles the decoder's and the job's code paths).
WARMUP = 300_000


def _compare(name: str, got: dict[tuple[Any, ...], int], want: dict[tuple[Any, ...], int]) -> None:
    lost = sum(max(0, n - got.get(k, 0)) for k, n in want.items())
    double = sum(max(0, n - want.get(k, 0)) for k, n in got.items())
    print(
        f"  {name}: {sum(got.values()):,} orders counted, recount {sum(want.values()):,}: "
        f"{lost} lost, {double} double-counted, {'EQUAL' if got == want else 'DIFFERENT'}"
    )


def main() -> None:  # noqa: PLR0915 (one script, phase after phase)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--postgres", help="use this PostgreSQL (superuser URL)")
    parser.add_argument("--kafka", help="use this Kafka cluster (host:port)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=WARMUP,
        help="records decoded, deduplicated and totalled (a batch query) to warm the JVM up "
        "before the pipeline phases (0: none, the first phase then pays for it)",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated, of {','.join(PHASES)} (raw always runs: the ratios need it)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the compare phase (each job once each)"
    )
    parser.add_argument(
        "--jobs",
        default="hand-written,same-work,pipeline",
        help="comma-separated jobs of the compare phase: hand-written, pipeline, and the "
        f"diagnostic variants {', '.join(JOB_VARIANTS)} (modifiers combine: "
        "pipeline:no-quarantine:no-persist)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a PipelineSettings field of every job (pipeline_max_offsets_per_trigger=200000)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark configuration for the session (spark-submit's --conf)",
    )
    args = parser.parse_args()
    phases = args.phases.split(",")
    extra: dict[str, Any] = dict(s.split("=", 1) for s in args.setting)
    extra.setdefault("pipeline_max_offsets_per_trigger", BATCH)

    # The driver holds the dedupe state of a local run: more than pyspark's 1 GiB default.
    confs = "".join(f" --conf {c}" for c in args.conf)
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-memory 4g{confs} pyspark-shell")
    from pyspark.sql import functions as F  # noqa: PLC0415

    from outboxkit.demo.events import registry  # noqa: PLC0415
    from outboxkit.demo.pipeline import order_totals, totals  # noqa: PLC0415
    from outboxkit.pipeline import (  # noqa: PLC0415
        PipelineSettings,
        build_session,
        decode,
        run,
        valid_events,
    )
    from outboxkit.pipeline.jars import pipeline_jars  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="outboxkit-bench-spark-") as tmp:
        workdir = Path(tmp)
        with _servers(args, workdir) as (pg_url, bootstrap):
            asyncio.run(_migrate(pg_url))
            topic = f"bench.orders-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            asyncio.run(_produce(bootstrap, topic, args.events, args.partitions))
            print(f"produced {args.events:,} events in {time.perf_counter() - started:.1f} s")

            def settings(name: str, **extra: Any) -> PipelineSettings:
                return PipelineSettings(
                    kafka_bootstrap_servers=bootstrap,
                    topics=topic,
                    database_url=pg_url,
                    pipeline_name=name,
                    pipeline_output=str(workdir / name),
                    spark_master=args.master,
                    **extra,
                )

            # The session's jars: the connector and Delta, and the hand-written job's driver.
            jars = workdir / "jars"
            jars.mkdir()
            for jar in [*pipeline_jars(), *(jdbc_driver() if "compare" in phases else [])]:
                (jars / jar.name).symlink_to(jar)
            started = time.perf_counter()
            spark = build_session(settings("bench", spark_jars=str(jars)))
            spark.sparkContext.setLogLevel("ERROR")
            print(f"SparkSession start: {time.perf_counter() - started:.1f} s ({args.master})")

            def source() -> Any:
                return (
                    spark.read.format("kafka")
                    .option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", topic)
                    .option("kafka.isolation.level", "read_committed")
                    .option("includeHeaders", "true")
                    .load()
                )

            jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
            raw = 0.0
            for attempt in (1, 2):  # the first read also warms the JVM up
                cpu = tree_cpu(jvm)
                started = time.perf_counter()
                count = source().count()
                elapsed = time.perf_counter() - started
                cpu = tree_cpu(jvm) - cpu
                raw = max(raw, count / elapsed)
                print(
                    f"raw kafka source count #{attempt}: {count:,} in {elapsed:.1f} s "
                    f"(Spark's CPU {cpu / max(count, 1) * 1e6:.1f} us/record)"
                )
            print(f"raw read rate: {raw:,.0f} records/s")
            if args.warmup:
                started = time.perf_counter()
                sample = decode(source().limit(args.warmup), registry).dropDuplicates(["event_id"])
                totals(valid_events(sample)).write.format("noop").mode("overwrite").save()
                print(
                    f"JVM warm-up: decode, dedupe and totals of {args.warmup:,} records (batch) "
                    f"in {time.perf_counter() - started:.1f} s"
                )

            for label, keep in (("postgresql", "postgres"), ("delta", "delta"), ("both", "")):
                if label not in phases:
                    continue
                job_settings = settings(f"bench-{label}", **extra)
                job = order_totals(job_settings, table=f"totals_{label}")
                outputs = [
                    type(o)(
                        o.name,
                        o.transform,
                        [s for s in o.sinks if keep in type(s).__name__.lower()],
                    )
                    for o in job.outputs
                ]
                job = type(job)(job.registry, outputs, job.quarantine)
                cpu = tree_cpu(jvm)
                started = time.perf_counter()
                report = run(job, job_settings, spark=spark)
                elapsed = time.perf_counter() - started
                cpu = tree_cpu(jvm) - cpu
                rate = report.input_rows / elapsed
                print(
                    f"pipeline into {label}: {report.input_rows:,} events in {elapsed:.1f} s "
                    f"({report.batches} batches) = {rate:,.0f} events/s = {rate / raw:.2f}x raw; "
                    f"Spark's CPU {cpu / max(report.input_rows, 1) * 1e6:.0f} us/event"
                )
                print(breakdown(report))

            if "compare" in phases:
                batch = int(extra["pipeline_max_offsets_per_trigger"])
                jobs = functools.partial(settings, **extra)
                ctx = Compare(spark, jvm, bootstrap, topic, pg_url, workdir, batch, jobs)
                compare_phase(ctx, args.jobs.split(","), args.rounds)

            if "kill" not in phases:
                spark.stop()
                return

            print("kill/restart:")
            killed = settings("bench-kill", **extra)
            env = {
                **os.environ,
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "OUTBOXKIT_TOPICS": topic,
                "OUTBOXKIT_DATABASE_URL": pg_url,
                "OUTBOXKIT_PIPELINE_JOB": "outboxkit.demo.pipeline:order_totals",
                "OUTBOXKIT_PIPELINE_NAME": killed.pipeline_name,
                "OUTBOXKIT_PIPELINE_OUTPUT": killed.pipeline_output,
                "OUTBOXKIT_PIPELINE_TRIGGER": "1",
                **{f"OUTBOXKIT_{k.upper()}": str(v) for k, v in extra.items()},
                "OUTBOXKIT_SPARK_MASTER": args.master,
            }
            env["OUTBOXKIT_SPARK_JARS"] = str(jars)
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("DROP TABLE IF EXISTS shop_order_totals")
                conn.execute("DELETE FROM outboxkit.pipeline_batches")
            log = (workdir / "driver.log").open("w")
            driver = subprocess.Popen(
                [sys.executable, "-m", "outboxkit.pipeline", "run"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and driver.poll() is None:
                with psycopg.connect(pg_url) as conn:
                    row = conn.execute("SELECT count(*) FROM outboxkit.pipeline_batches").fetchone()
                if row and row[0] >= 2:
                    break
                time.sleep(0.5)
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            before = sum(_pg_totals(pg_url, "shop_order_totals").values())
            print(f"  killed the driver (SIGKILL) with {before:,} orders counted")
            started = time.perf_counter()
            report = run(order_totals(killed), killed, spark=spark)
            print(
                f"  resumed: {report.input_rows:,} records in {report.batches} batches, "
                f"{time.perf_counter() - started:.1f} s"
            )
            decoded = decode(source(), registry)
            events = decoded.where(F.col("error_reason").isNull()).dropDuplicates(["event_id"])
            want = _frame_totals(totals(events))
            _compare("postgresql", _pg_totals(pg_url, "shop_order_totals"), want)
            delta = spark.read.format("delta").load(killed.output("order_totals"))
            _compare("delta", _frame_totals(delta), want)
            spark.stop()


if __name__ == "__main__":
    main()
