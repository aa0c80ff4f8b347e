"""The Spark pipeline against a real Kafka broker and PostgreSQL, in local[2].

The demo's job (``outboxkit.demo.pipeline:order_totals``) writes order totals to PostgreSQL and
to a Delta table: both must equal a plain recount (in Python) of the distinct valid events,
some of them written by another producer's CloudEvents SDK (binary and structured content
mode, one in both); bad records are in the quarantine table with their error; a driver killed
with SIGKILL and restarted from its checkpoint counts nothing twice, in either sink. A job
written for version 2 of the order reads a stream mixing versions 1 and 2 through the
registry's upcaster.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent

from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.demo.events import Currency, OrderLine, OrderPlaced, PaymentCaptured
from outboxkit.embedded._process import wait_until
from outboxkit.embedded.kafka_security import SecuredKafkaCluster
from outboxkit.embedded.spark_jvm import quick_jvm_options, spark_class_archive
from outboxkit.schemas import Event, EventRegistry, encode
from tests.helpers import mapped_class_archives
from tests.integration.conftest import REPO, MakeTopic

pyspark = pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from pyspark.sql import SparkSession  # noqa: E402

from outboxkit.demo.pipeline import order_totals  # noqa: E402
from outboxkit.pipeline import (  # noqa: E402
    BatchInfo,
    DeltaSink,
    Output,
    Pipeline,
    PipelineSettings,
    PostgresSink,
    event_column,
    run,
)
from outboxkit.pipeline.job import read_kafka  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration]

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
Record = tuple[bytes, bytes | None, list[tuple[str, bytes]]]


# --- events and the plain recount --------------------------------------------------------------


def order(n: int, at: datetime, *, customer: str | None = None, topic: str) -> OrderPlaced:
    quantity = 1 + n % 3
    price = Decimal(10 + n % 7) + Decimal("0.25")
    return OrderPlaced(
        topic=topic,
        occurred_at=at,
        order_id=f"o-{n}",
        customer_id=customer or f"c-{n % 3}",
        currency=Currency.EUR if n % 4 else Currency.USD,
        lines=[OrderLine(sku=f"s-{n}", quantity=quantity, unit_price=price)],
        amount=price * quantity,
        note="gift" if n % 5 == 0 else None,
    )


def wire(event: Event) -> Record:
    encoded = encode(event, source="urn:test:shop")
    return encoded.key, encoded.value, list(encoded.headers)


@dataclass(frozen=True)
class Total:
    orders: int
    items: int
    amount: Decimal


TotalsKey = tuple[datetime, str, str]


def recount(events: list[OrderPlaced]) -> dict[TotalsKey, Total]:
    """Order totals of the distinct events, in plain Python."""
    distinct = {e.id: e for e in events}.values()
    orders: Counter[TotalsKey] = Counter()
    items: Counter[TotalsKey] = Counter()
    amounts: dict[TotalsKey, Decimal] = {}
    for e in distinct:
        start = e.occurred_at.replace(minute=0, second=0, microsecond=0)
        key = (start, e.customer_id, e.currency.value)
        orders[key] += 1
        items[key] += sum(line.quantity for line in e.lines)
        amounts[key] = amounts.get(key, Decimal(0)) + e.amount
    return {k: Total(orders[k], items[k], amounts[k]) for k in orders}


def serving_table(url: str, table: str = "shop_order_totals") -> dict[TotalsKey, Total]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT window_start, customer_id, currency, orders, items, amount FROM {table}"
        ).fetchall()
    return {(r[0], r[1], r[2]): Total(r[3], r[4], r[5]) for r in rows}


def lake(spark: SparkSession, settings: PipelineSettings) -> dict[TotalsKey, Total]:
    path = settings.output("order_totals")
    table = spark.read.format("delta").load(path).toArrow().to_pylist()
    result = {(r["window_start"], r["customer_id"], r["currency"]): r for r in table}
    assert len(result) == len(table), "a window is in the Delta table twice"
    return {k: Total(r["orders"], r["items"], r["amount"]) for k, r in result.items()}


def quarantine_rows(spark: SparkSession, settings: PipelineSettings) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = (
        spark.read.format("delta").load(settings.output("quarantine")).toArrow().to_pylist()
    )
    return rows


async def produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, value, headers in records:
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


def settings_for(
    tmp_path: Path, bootstrap: str, topic: str, pg_url: str, **extra: Any
) -> PipelineSettings:
    return PipelineSettings(
        kafka_bootstrap_servers=bootstrap,
        topics=topic,
        database_url=pg_url,
        pipeline_name="test",
        pipeline_output=str(tmp_path / "lake"),
        pipeline_checkpoint=str(tmp_path / "checkpoints"),
        pipeline_watermark=HOUR,
        spark_shuffle_partitions=2,
        **extra,
    )


def newer_producer(record: Record) -> Record:
    """The record as a producer a model version ahead writes it: a field added to the order
    and to its lines, which this job's models do not declare (read, ignored, counted)."""
    key, value, headers = record
    assert value is not None
    value = value.replace(b'"note":', b'"gift_wrap":true,"note":', 1)
    return key, value.replace(b'"quantity":', b'"warehouse":"w1","quantity":'), headers


def foreign(event: OrderPlaced, *, binary: bool) -> Record:
    """The event as another producer writes it with its CloudEvents SDK (here the official SDK
    for Python): an id that is not a UUID, no schemaversion, binary or structured content
    mode. Its id is the same in both modes, so its order counts once in the recount."""
    payload = json.loads(wire(event)[1] or b"")
    sdk = CloudEvent(
        attributes={
            "type": event.event_type,
            "source": "urn:go:checkout",
            "id": f"checkout-{event.order_id}",
            "time": event.occurred_at,
            "partitionkey": event.key,
        },
        data=payload,
    )
    message = kafka.to_binary_event(sdk) if binary else kafka.to_structured_event(sdk)
    return event.key.encode(), message.value, list(message.headers.items())


def garbage(template: Record) -> tuple[list[Record], list[str]]:
    """Records that must not decode, and the reason each gets."""
    key, value, headers = template
    assert value is not None

    def swap(name: str, new: bytes) -> list[tuple[str, bytes]]:
        return [(k, new if k == name else v) for k, v in headers]

    records: list[Record] = [
        (key, b"\xff not json", headers),
        (key, value, []),
        (key, value, swap("ce_type", b"shop.order_refunded")),
        (key, value, swap("ce_schemaversion", b"7")),
        (key, value.replace(b'"amount":"', b'"amount":"-'), headers),
        (key, None, headers),
    ]
    reasons = [
        "invalid_value",
        "missing_header",
        "unknown_type",
        "unsupported_version",
        "invalid_payload",
        "invalid_value",
    ]
    return records, reasons


# --- tests -------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_sinks_equal_a_recount_of_distinct_valid_events(
    spark: SparkSession, kafka_bootstrap: str, make_topic: MakeTopic, pg_url: str, tmp_path: Path
) -> None:
    topic = await make_topic("shop.orders", partitions=2)
    rng = random.Random(6)
    # Five hours of orders, sent out of order (up to 40 min back: within the 1 h watermark).
    events = [order(n, T0 + timedelta(minutes=3 * n), topic=topic) for n in range(100)]
    sent = sorted(events, key=lambda e: e.occurred_at + timedelta(minutes=rng.randrange(40)))
    records = [
        foreign(e, binary=i % 2 == 0)
        if i % 9 == 8
        else newer_producer(wire(e))
        if i % 7 == 0
        else wire(e)
        for i, e in enumerate(sent)
    ]
    # A foreign event again in the other content mode: the same source and id, counted once.
    records.insert(40, foreign(sent[8], binary=False))  # sent[8] went in binary mode
    first_dup, late_dup = records[0], records[60]
    records.insert(1, first_dup)  # a relay re-send, right after
    records.insert(80, late_dup)  # the same id again, 20 records later
    records.insert(90, first_dup)  # and a third time, far apart
    bad, reasons = garbage(records[5])
    for index, record in zip((3, 30, 50, 70, 95, 99), bad, strict=True):
        records.insert(index, record)
    payment = PaymentCaptured(
        topic=topic,
        payment_id="p-1",
        order_id="o-1",
        customer_id="c-1",
        currency=Currency.EUR,
        amount=Decimal("1.00"),
        occurred_at=T0,
    )
    records.append(wire(payment))  # valid, another type: decoded, not an order total
    await produce(kafka_bootstrap, topic, records)

    settings = settings_for(tmp_path, kafka_bootstrap, topic, pg_url)
    job = order_totals(settings)
    report = await asyncio.to_thread(run, job, settings, spark=spark)

    expected = recount(events)
    assert serving_table(pg_url) == expected
    assert lake(spark, settings) == expected
    newest = max(e.occurred_at for e in events)
    assert report.name == "test"
    assert report.input_rows == len(records)

    quarantine = quarantine_rows(spark, settings)
    by_value = sorted(quarantine, key=lambda r: r["source_offset"])
    assert sorted(r["error_reason"] for r in by_value) == sorted(reasons)
    bad_values = {r[1] for r in bad}
    assert {r["value"] for r in quarantine} == bad_values
    for row in quarantine:
        assert row["source_topic"] == topic
        assert row["source_partition"] in (0, 1)
        assert row["error_message"]
        assert row["pipeline"] == "test"
    unknown = next(r for r in quarantine if r["error_reason"] == "unknown_type")
    assert {"key": "ce_type", "value": b"shop.order_refunded"} in unknown["headers"]

    # Later: a duplicate of the oldest event (older than the watermark now), an event that is
    # late beyond the watermark, and one on time. Only the last one counts.
    on_time = order(500, newest + timedelta(minutes=5), topic=topic)
    too_late = order(501, newest - 2 * HOUR, topic=topic)
    await produce(kafka_bootstrap, topic, [first_dup, wire(too_late), wire(on_time)])
    report = await asyncio.to_thread(run, job, settings, spark=spark)
    assert serving_table(pg_url) == recount([*events, on_time])
    assert report.late_rows == 2
    assert lake(spark, settings) == recount([*events, on_time])
    assert len(quarantine_rows(spark, settings)) == len(bad)


def test_a_replayed_batch_writes_nothing(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    sink = PostgresSink(
        "replayed",
        keys=["k"],
        add=["n"],
        ddl="CREATE TABLE replayed (k text PRIMARY KEY, n int NOT NULL)",
    )
    sink.prepare(spark, str(tmp_path), pg_url)

    def batch(query_id: str, batch_id: int) -> BatchInfo:
        return BatchInfo(query_id, "test.replay", batch_id, str(tmp_path), pg_url)

    query_id = "6f1c2f1e-8a0b-4d39-9e38-3b8f3c0f9a11"
    rows = spark.createDataFrame([("a", 1), ("b", 1)], "k string, n int")
    assert sink.write(rows, batch(query_id, 7)) is True
    assert sink.write(rows, batch(query_id, 7)) is False
    assert sink.write(rows.where("k = 'a'"), batch(query_id, 8)) is True
    other_checkpoint = "0d9e3a6c-2f55-4a8e-9f1e-0c7d2b1a4e22"
    assert sink.write(rows.where("k = 'b'"), batch(other_checkpoint, 7)) is True
    with psycopg.connect(pg_url) as conn:
        assert dict(conn.execute("SELECT k, n FROM replayed").fetchall()) == {"a": 2, "b": 2}
        assert conn.execute("SELECT count(*) FROM outboxkit.pipeline_batches").fetchone() == (3,)

    merged = DeltaSink(str(tmp_path / "merged"), keys=["k"], add=["n"])
    appended = DeltaSink(str(tmp_path / "appended"))
    for delta in (merged, appended):
        delta.write(rows, batch(query_id, 7))
        delta.write(rows, batch(query_id, 7))
        delta.write(rows.where("k = 'a'"), batch(query_id, 8))
        delta.write(rows.where("k = 'a'"), batch(query_id, 8))
    table = spark.read.format("delta").load(str(tmp_path / "merged")).toArrow().to_pylist()
    assert {r["k"]: r["n"] for r in table} == {"a": 2, "b": 1}
    table = spark.read.format("delta").load(str(tmp_path / "appended")).toArrow().to_pylist()
    assert sorted(r["k"] for r in table) == ["a", "a", "b"]


def _batches_written(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outboxkit.pipeline_batches").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.timeout(420)
async def test_a_driver_killed_mid_run_resumes_without_double_counting(
    *,
    spark: SparkSession,
    spark_jars: list[Path],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    pg_url: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic("shop.orders", partitions=2)
    events = [order(n, T0 + timedelta(minutes=2 * n), topic=topic) for n in range(300)]
    records = [wire(e) for e in events]
    records[150:150] = records[10:20]  # re-sends, far from the originals
    bad, _ = garbage(records[0])
    records[200:200] = bad
    await produce(kafka_bootstrap, topic, records)
    settings = settings_for(
        tmp_path, kafka_bootstrap, topic, pg_url, pipeline_max_offsets_per_trigger=40
    )
    jars_dir = tmp_path / "jars"  # OUTBOXKIT_SPARK_JARS: one directory with every jar
    jars_dir.mkdir()
    for jar in spark_jars:
        (jars_dir / jar.name).symlink_to(jar)
    env = {
        **os.environ,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": topic,
        "OUTBOXKIT_DATABASE_URL": pg_url,
        "OUTBOXKIT_PIPELINE_NAME": settings.pipeline_name,
        "OUTBOXKIT_PIPELINE_OUTPUT": settings.pipeline_output,
        "OUTBOXKIT_PIPELINE_CHECKPOINT": settings.checkpoint,
        "OUTBOXKIT_PIPELINE_TRIGGER": "0.5",
        "OUTBOXKIT_PIPELINE_JOB": "outboxkit.demo.pipeline:order_totals",
        "OUTBOXKIT_PIPELINE_WATERMARK": "PT1H",
        "OUTBOXKIT_PIPELINE_MAX_OFFSETS_PER_TRIGGER": "40",
        "OUTBOXKIT_SPARK_SHUFFLE_PARTITIONS": "2",
        "OUTBOXKIT_SPARK_MASTER": "local[2]",
        "OUTBOXKIT_SPARK_JARS": str(jars_dir),
        **fast_jvm_environment(tmp_path),
    }
    await asyncio.to_thread(_run_and_kill, env, tmp_path / "driver.log", pg_url)
    written_before_kill = _batches_written(pg_url)
    assert 0 < serving_rows_orders(pg_url) < len(events), "the kill came too late or too early"

    # The restart re-runs the batch the kill interrupted (its offsets are in the checkpoint),
    # then catches up without the per-batch limit.
    unlimited = settings.model_copy(update={"pipeline_max_offsets_per_trigger": None})
    await asyncio.to_thread(run, order_totals(unlimited), unlimited, spark=spark)

    expected = recount(events)
    assert serving_table(pg_url) == expected
    assert lake(spark, settings) == expected
    quarantine = quarantine_rows(spark, settings)
    assert sorted(r["source_offset"] for r in quarantine) == sorted(
        {r["source_offset"] for r in quarantine}
    )
    assert len(quarantine) == len(bad)
    assert _batches_written(pg_url) > written_before_kill


def fast_jvm_properties(tmp_path: Path) -> Path:
    """A ``--properties-file`` that gives a driver and its executors
    :func:`~outboxkit.embedded.spark_jvm.quick_jvm_options`: these runs last seconds, and on two
    cores HotSpot's C2 compiling Spark's code took about 40% of a spark-submit run's CPU (93-96 s
    of CPU with Spark's defaults, 48-58 s with C1 and the serial GC). A file, not a
    ``SPARK_CONF_DIR``: a directory with files on the classpath keeps the JVM from mapping the
    class archive."""
    path = tmp_path / "spark-defaults.conf"
    options = quick_jvm_options()
    path.write_text(
        f"spark.driver.extraJavaOptions {options}\nspark.executor.extraJavaOptions {options}\n"
    )
    return path


def fast_jvm_environment(tmp_path: Path) -> dict[str, str]:
    """What gives a driver that pyspark starts (``outboxkit pipeline run``) and its executors
    :func:`fast_jvm_properties`."""
    properties = shlex.quote(str(fast_jvm_properties(tmp_path)))
    return {"PYSPARK_SUBMIT_ARGS": f"--properties-file {properties} pyspark-shell"}


def _run_and_kill(env: dict[str, str], log_path: Path, pg_url: str) -> None:
    """Run the CLI driver with a processing-time trigger; SIGKILL it after two batches."""
    with log_path.open("w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "outboxkit.pipeline", "run"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the Python driver and its JVM
        )
        try:
            wait_until(
                lambda: _batches_written(pg_url) >= 2,
                timeout=240,
                what="two batches",
                process=driver,
            )
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)


def serving_rows_orders(url: str) -> int:
    return sum(total.orders for total in serving_table(url).values())


@pytest.mark.timeout(300)
async def test_the_pipeline_reads_a_sasl_ssl_topic(
    spark: SparkSession,
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    pg_url: str,
    tmp_path: Path,
) -> None:
    """The same Kafka settings as every other component, as the Kafka source's options: TLS
    with the test authority (a PEM trust store), a SCRAM-SHA-512 login; the password never
    in the query plan."""
    topic = await make_secured_topic("shop.orders", partitions=2)
    events = [order(n, T0 + timedelta(minutes=7 * n), topic=topic) for n in range(30)]
    await produce(secured_kafka.plaintext_bootstrap, topic, [wire(e) for e in events])
    kafka = secured_kafka.settings("admin")
    settings = settings_for(
        tmp_path, kafka.kafka_bootstrap_servers[0], topic, pg_url, **_security_fields(kafka)
    )
    report = await asyncio.to_thread(run, order_totals(settings), settings, spark=spark)
    assert report.input_rows == len(events)
    assert serving_table(pg_url) == recount(events)
    plan = read_kafka(spark, settings, [topic])._jdf.queryExecution().analyzed().toString()
    assert secured_kafka.users["admin"] not in plan + str(report)
    assert "jaas" in spark.conf.get("spark.sql.redaction.options.regex", "")


def _security_fields(kafka: KafkaConnectionSettings) -> dict[str, Any]:
    return {
        name: getattr(kafka, name)
        for name in KafkaConnectionSettings.model_fields
        if name != "kafka_bootstrap_servers"
    }


class OrderPlacedV2(Event, type="shop.order_placed", version=2, key_field="order_id"):
    """The order as its next version has it: one total, the lines gone."""

    order_id: str
    customer_id: str
    currency: Currency
    total: Decimal


def order_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": payload["order_id"],
        "customer_id": payload["customer_id"],
        "currency": payload["currency"],
        "total": payload["amount"],
    }


def customer_totals(events: Any) -> Any:
    from pyspark.sql import functions as F  # noqa: PLC0415

    order = F.col(event_column(OrderPlacedV2))
    return (
        events.where(order.isNotNull())
        .groupBy(order["customer_id"].alias("customer_id"))
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.sum(order["total"]).cast("decimal(38,2)").alias("total"),
        )
    )


@pytest.mark.timeout(300)
async def test_a_job_on_version_2_reads_version_1_through_the_upcaster(
    spark: SparkSession, kafka_bootstrap: str, make_topic: MakeTopic, pg_url: str, tmp_path: Path
) -> None:
    """Deploy order (b) of docs/schemas.md for the pipeline: v1 records in the topic (and from
    producers not yet upgraded), then v2; the job knows only v2 and the upcaster. Exact totals,
    nothing quarantined."""
    topic = await make_topic("shop.orders.v2", partitions=2)
    v1 = [order(n, T0 + timedelta(minutes=n), topic=topic) for n in range(40)]
    v2 = [
        OrderPlacedV2(
            topic=topic,
            order_id=f"o2-{n}",
            customer_id=f"c-{n % 3}",
            currency=Currency.EUR,
            total=Decimal(n) + Decimal("0.25"),
        )
        for n in range(20)
    ]
    records = [wire(e) for e in v1[:20]] + [wire(e) for e in v2] + [wire(e) for e in v1[20:]]
    await produce(kafka_bootstrap, topic, records)

    registry = EventRegistry()
    registry.register(OrderPlacedV2)
    registry.upcaster(OrderPlacedV2, from_version=1)(order_v1_to_v2)
    table = "customer_totals_v2"
    ddl = f"CREATE TABLE {table} (customer_id text PRIMARY KEY, orders bigint, total numeric(38,2))"
    sink = PostgresSink(table, keys=["customer_id"], add=["orders", "total"], ddl=ddl)
    job = Pipeline(registry, [Output("customer_totals", customer_totals, [sink])])
    settings = settings_for(tmp_path, kafka_bootstrap, topic, pg_url)
    report = await asyncio.to_thread(run, job, settings, spark=spark)

    expected: dict[str, tuple[int, Decimal]] = {}
    for customer, total in [(e.customer_id, e.amount) for e in v1] + [
        (e.customer_id, e.total) for e in v2
    ]:
        orders, amount = expected.get(customer, (0, Decimal(0)))
        expected[customer] = (orders + 1, amount + total)
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(f"SELECT customer_id, orders, total FROM {table}").fetchall()
    assert {r[0]: (r[1], r[2]) for r in rows} == expected
    assert report.input_rows == len(records)
    quarantine = Path(settings.output("quarantine"))
    assert not await asyncio.to_thread(quarantine.exists), "nothing was quarantined"


def test_the_quick_jvm_maps_the_class_archive(spark: SparkSession) -> None:
    """A driver given :func:`~outboxkit.embedded.spark_jvm.quick_jvm_options` (the session
    here, and every driver and executor of these tests) maps the archive of Spark's classes:
    one that cannot (a ``SPARK_CONF_DIR`` with files on its classpath, another JDK build)
    starts without it, only slower."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    archive = str(spark_class_archive())
    assert archive in mapped_class_archives(pid)
