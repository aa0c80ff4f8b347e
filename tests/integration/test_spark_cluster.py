"""The Spark pipeline on a real Spark standalone cluster (a master and two workers, executors in
JVMs of their own), not ``local[2]``.

- ``spark-submit --master spark://…`` runs the pipeline's ``__main__.py`` as docs/spark.md says:
  the connector and Delta shipped with ``--jars``, the executors' Python named by
  ``spark.pyspark.python``; both workers run an executor; the sinks equal a recount.
- ``outboxkit pipeline run --master spark://…`` reads a 3-broker Kafka (replication factor 3,
  ``min.insync.replicas=2``) while events keep arriving; mid-stream one worker is lost (the
  worker, its executor and its Python workers, SIGKILL) and then one broker (the leader of a
  partition of the topic, SIGKILL); neither comes back. The job goes on with the other worker
  and the other brokers, and at the end the PostgreSQL table, the Delta table and the quarantine
  equal a batch recount of what the topic holds: nothing lost, nothing counted twice.

Workers run without the driver's virtualenv (:mod:`outboxkit.embedded.spark_cluster`), so an
executor that ran the wrong Python (``python3`` from its ``PATH``) would fail the job.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.demo.events import OrderPlaced, registry
from outboxkit.embedded._process import wait_until
from outboxkit.embedded.kafka import KafkaCluster
from outboxkit.embedded.spark_cluster import SparkCluster, submit_command
from outboxkit.embedded.spark_jvm import spark_class_archive
from outboxkit.schemas import EventDecodeError
from tests.helpers import mapped_class_archives
from tests.integration.conftest import REPO, MakeTopic
from tests.integration.test_spark_pipeline import (
    T0,
    fast_jvm_environment,
    fast_jvm_properties,
    garbage,
    lake,
    order,
    produce,
    quarantine_rows,
    recount,
    serving_table,
    settings_for,
    wire,
)

pyspark = pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from pyspark.sql import SparkSession  # noqa: E402

import outboxkit.pipeline  # noqa: E402
from outboxkit.pipeline.session import DELTA_CONF  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration]

JOB = "outboxkit.demo.pipeline:order_totals"
#: Events 3 s apart: the whole stream spans less than the 1 h watermark, so no event is ever
#: late, whichever micro-batch reads it, and every duplicate is still in the dedupe state.
STEP = timedelta(seconds=3)


def driver_env(settings_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The driver's environment: this one's, minus any ``PYSPARK_PYTHON`` (the session fixture
    sets it in this process; the product must choose the executors' Python itself), with
    :func:`~tests.integration.test_spark_pipeline.fast_jvm_environment` for a driver that
    pyspark starts (a spark-submit run takes ``--properties-file`` on its command line)."""
    env = {
        k: v for k, v in os.environ.items() if k not in {"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    }
    # Executors on the workers connect back to the driver: on loopback, whatever the host name.
    return {
        **env,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **fast_jvm_environment(tmp_path),
        **settings_env,
    }


def pipeline_env(
    bootstrap: str, topic: str, pg_url: str, tmp_path: Path, **extra: str
) -> dict[str, str]:
    return {
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOXKIT_TOPICS": topic,
        "OUTBOXKIT_DATABASE_URL": pg_url,
        "OUTBOXKIT_PIPELINE_NAME": "test",
        "OUTBOXKIT_PIPELINE_OUTPUT": str(tmp_path / "lake"),
        "OUTBOXKIT_PIPELINE_CHECKPOINT": str(tmp_path / "checkpoints"),
        "OUTBOXKIT_PIPELINE_WATERMARK": "PT1H",
        **extra,
    }


def batches_written(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outboxkit.pipeline_batches").fetchone()
    return int(row[0]) if row else 0


def orders_counted(url: str) -> int:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT to_regclass('shop_order_totals') IS NOT NULL").fetchone()
        if not (found and found[0]):
            return 0
        row = conn.execute("SELECT coalesce(sum(orders), 0) FROM shop_order_totals").fetchone()
    return int(row[0]) if row else 0


@contextmanager
def driver(argv: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[str]]:
    """The driver in its own process group (its Python and its JVM); killed if still running."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)


def app_executors(cluster: SparkCluster) -> dict[int, int]:
    """Executors started by each worker (by worker number), over every application."""
    return {w.number: len(w.executor_dirs()) for w in cluster.workers}


async def topic_recount(
    bootstrap: str, topic: str, partitions: int
) -> tuple[list[OrderPlaced], int]:
    """A batch recount of the whole topic: its orders (duplicates included) and the number of
    records that do not decode, read with ``read_committed`` from the first offset to the end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        end = await consumer.end_offsets(assigned)
        orders: list[OrderPlaced] = []
        bad = 0
        while [tp for tp in assigned if await consumer.position(tp) < end[tp]]:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    try:
                        event = registry.decode_record(record)
                    except EventDecodeError:
                        bad += 1
                        continue
                    if isinstance(event, OrderPlaced):
                        orders.append(event)
        return orders, bad
    finally:
        await consumer.stop()


# --- spark-submit ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_spark_submit_runs_the_pipeline_on_both_workers(
    *,
    spark_cluster: SparkCluster,
    spark_jars: list[Path],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    pg_url: str,
    tmp_path: Path,
) -> None:
    """The cluster starts and runs a job: the pipeline submitted as docs/spark.md shows, its
    executors on both workers. Would catch a cluster that does not start or schedule, a
    connector or Delta jar not shipped to the executors, executors without the job's Python
    (they would run the workers' ``python3``, which has no outboxkit), or a path the executors
    cannot write."""
    topic = await make_topic("shop.orders", partitions=2)
    events = [order(n, T0 + n * STEP, topic=topic) for n in range(60)]
    records = [wire(e) for e in events]
    records[30:30] = records[:5]  # re-sends
    await produce(kafka_bootstrap, topic, records)

    main = Path(outboxkit.pipeline.__path__[0]) / "__main__.py"
    argv = submit_command(
        spark_cluster,
        *("--properties-file", str(fast_jvm_properties(tmp_path))),  # the JVMs' options
        *("--jars", ",".join(map(str, spark_jars))),
        *(arg for k, v in DELTA_CONF.items() for arg in ("--conf", f"{k}={v}")),
        *("--conf", f"spark.pyspark.python={sys.executable}"),
        *("--conf", "spark.sql.shuffle.partitions=2"),
        *("--conf", "spark.databricks.delta.snapshotPartitions=2"),
        str(main),
        *("run", "--job", JOB),
    )
    env = driver_env(pipeline_env(kafka_bootstrap, topic, pg_url, tmp_path), tmp_path)
    log_path = tmp_path / "spark-submit.log"
    with driver(argv, env, log_path) as process:
        returncode = await asyncio.to_thread(process.wait, 240)
    output = log_path.read_text(errors="replace")
    assert returncode == 0, output[-3000:]
    assert f" batches, {len(records)} records, 0 late rows dropped" in output, output[-3000:]

    assert serving_table(pg_url) == recount(events)
    assert all(count >= 1 for count in app_executors(spark_cluster).values())
    # The master and the workers map the archive of Spark's classes (spark_jvm).
    archive = str(spark_class_archive())
    daemons = [spark_cluster.master, *spark_cluster.workers]
    assert all(archive in mapped_class_archives(d.pid or 0) for d in daemons)


# --- a lost worker and a lost broker -----------------------------------------------------------


async def create_replicated_topic(kafka: KafkaCluster, partitions: int) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        name = f"shop.orders-{os.urandom(5).hex()}"
        topic = NewTopic(name, partitions, 3, topic_configs={"min.insync.replicas": "2"})
        await admin.create_topics([topic])
        return name
    finally:
        await admin.close()


async def partition_leaders(kafka: KafkaCluster, topic: str) -> dict[int, int]:
    """Partition → node id of its leader."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


async def wait_for(
    condition: Callable[[], bool], what: str, process: subprocess.Popen[str], log: Path
) -> None:
    await asyncio.to_thread(
        wait_until, condition, timeout=240, what=what, process=process, log_path=log
    )


@pytest.fixture
def kafka3(kafka_factory: Callable[[int], KafkaCluster]) -> Iterator[Future[KafkaCluster]]:
    """A 3-broker Kafka, started in the background while the Spark cluster starts."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(kafka_factory, 3)


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_the_pipeline_survives_a_lost_worker_and_a_lost_broker(
    request: pytest.FixtureRequest,
    kafka3: Future[KafkaCluster],
    spark_cluster: SparkCluster,
    pg_url: str,
    tmp_path: Path,
) -> None:
    """0 lost, 0 double, through a lost node and a lost broker. Would catch: a job that dies
    with its executor or with a broker (the driver exits, the count stops short), a micro-batch
    re-run after the executor loss that writes twice (PostgreSQL or Delta counts above the
    recount, a quarantine row twice), records skipped across the leader change (counts below
    it), and the driver not giving the executors its Python or its jars."""
    kafka = await asyncio.wrap_future(kafka3)
    bootstrap = kafka.bootstrap_servers
    topic = await create_replicated_topic(kafka, partitions=3)  # replication factor 3
    events = [order(n, T0 + n * STEP, topic=topic) for n in range(900)]
    first, then = [wire(e) for e in events[:600]], [wire(e) for e in events[600:]]
    bad, _ = garbage(first[0])
    first[100:100] = bad[:3]
    then[50:50] = [*first[10:20], *bad[3:], *first[400:410]]  # re-sends, far from the originals
    await produce(bootstrap, topic, first)

    env = driver_env(
        pipeline_env(
            bootstrap,
            topic,
            pg_url,
            tmp_path,
            OUTBOXKIT_PIPELINE_JOB=JOB,
            OUTBOXKIT_PIPELINE_TRIGGER="1",
            OUTBOXKIT_PIPELINE_MAX_OFFSETS_PER_TRIGGER="300",
            OUTBOXKIT_SPARK_SHUFFLE_PARTITIONS="2",
            OUTBOXKIT_SPARK_MASTER=spark_cluster.master_url,
        ),
        tmp_path,
    )
    log = tmp_path / "driver.log"
    argv = [sys.executable, "-m", "outboxkit", "pipeline", "run"]
    with driver(argv, env, log) as process:
        # 300 records per micro-batch: each kill lands while the next batch runs.
        await wait_for(lambda: batches_written(pg_url) >= 1, "a first batch", process, log)
        lost_worker = spark_cluster.workers[0]
        assert lost_worker.executor_dirs(), "the worker to lose ran no executor"
        lost_worker.kill()
        await produce(bootstrap, topic, then)
        await wait_for(lambda: batches_written(pg_url) >= 2, "a batch more", process, log)

        leaders = await partition_leaders(kafka, topic)
        lost_broker = kafka.nodes[leaders[0] - 1]
        await asyncio.to_thread(lost_broker.kill)
        await wait_for(
            lambda: orders_counted(pg_url) >= len(events), "every order counted", process, log
        )
        os.killpg(process.pid, signal.SIGTERM)
        try:  # the driver's own stop grace is 25 s (OUTBOXKIT_PIPELINE_STOP_GRACE)
            returncode = await asyncio.to_thread(process.wait, 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after SIGTERM:\n{log.read_text()[-5000:]}")
    output = log.read_text(errors="replace")
    assert returncode == 0, output[-3000:]
    assert "a local path on a cluster" in output  # the lake and checkpoints: plain paths
    # Offset lookups after the broker loss: bounded per attempt, not Kafka's 60 s default.
    lookups = [int(ms) for ms in re.findall(r"'latestOffset': (\d+)", output)]
    assert lookups, output[-3000:]
    assert max(lookups) < 45_000, lookups

    topic_orders, undecodable = await topic_recount(bootstrap, topic, partitions=3)
    assert {e.id for e in topic_orders} == {e.id for e in events}
    expected = recount(topic_orders)
    settings = settings_for(tmp_path, bootstrap, topic, pg_url)
    assert serving_table(pg_url) == expected
    # The local session reads the Delta tables; asked for only now, so that its JVM does not
    # start while the cluster works (in a whole run it is already up).
    spark: SparkSession = request.getfixturevalue("spark")
    assert lake(spark, settings) == expected
    quarantine = quarantine_rows(spark, settings)
    positions = {(r["source_partition"], r["source_offset"]) for r in quarantine}
    assert len(quarantine) == len(positions) == undecodable == len(bad)
    assert not lost_worker.running
    assert spark_cluster.workers[1].executor_dirs()
