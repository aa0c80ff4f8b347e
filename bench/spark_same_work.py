"""The same-work hand-written job of bench/spark.py's compare phase (issue #42): the guarantees
of ``outboxkit.pipeline`` written by hand, in idiomatic Spark SQL, with no outboxkit code.

- ``readStream.format("kafka")`` with ``read_committed`` and ``includeHeaders``;
  ``from_json(value::string, <OrderPlaced payload schema>)``; the CloudEvents id, type and time
  from the headers with ``element_at(map_from_entries(headers), …)``;
- a validation column (not JSON, id not a canonical UUID, unknown type, bad time, a missing
  field, no lines): the invalid rows go to a quarantine table with their reason and bytes;
- ``withWatermark("occurred_at", "1 hour").dropDuplicatesWithinWatermark(["event_id"])`` (an
  invalid row's ``event_id`` is its Kafka position, so bad rows are not deduplicated against
  each other);
- ``foreachBatch``: the batch ledger checked first; ``persist``; the quarantine rows appended
  by JDBC; the valid rows summed per hour, customer and currency (orders, items with
  ``aggregate`` over the lines, amount); the totals written to a staging table by JDBC, then
  one psycopg transaction that adds them into the totals table and records the batch id in the
  ledger.

Modifiers (diagnostics, each weakens a guarantee; ``--jobs same-work:no-dedupe``): see
:data:`SAME_WORK_VARIANTS`.
"""

from __future__ import annotations

from typing import Any

import psycopg

#: The payload as a data engineer writes it for ``from_json`` (OrderPlaced's JSON fields).
ORDER_SCHEMA = (
    "order_id STRING, customer_id STRING, currency STRING, "
    "lines ARRAY<STRUCT<sku: STRING, quantity: INT, unit_price: DECIMAL(38,2)>>, "
    "amount DECIMAL(38,2), note STRING"
)
ORDER_TYPE = "shop.order_placed"
UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

SAME_WORK_VARIANTS = {
    "same-work": "the guarantees written by hand (see bench/spark_same_work.py)",
    "same-work:no-dedupe": "… without the watermark and dropDuplicatesWithinWatermark",
    "same-work:no-quarantine": "… without the quarantine table's append",
    "same-work:no-persist": "… the micro-batch not persisted (each write reads it again)",
    "same-work:noop-sink": "… totals computed, then written to Spark's noop format (no ledger)",
}

TOTALS_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    window_start timestamptz NOT NULL, window_end timestamptz NOT NULL,
    customer_id text NOT NULL, currency text NOT NULL,
    orders bigint NOT NULL, items bigint NOT NULL, amount numeric(38,2) NOT NULL,
    PRIMARY KEY (window_start, customer_id, currency)
);
CREATE TABLE IF NOT EXISTS {table}_stage (LIKE {table});
CREATE TABLE IF NOT EXISTS {table}_ledger (batch_id bigint PRIMARY KEY);
"""

UPSERT = """
INSERT INTO {table} AS t SELECT * FROM {table}_stage
ON CONFLICT (window_start, customer_id, currency) DO UPDATE SET
    window_end = excluded.window_end, orders = t.orders + excluded.orders,
    items = t.items + excluded.items, amount = t.amount + excluded.amount
"""


def validated(records: Any) -> Any:
    """Kafka rows → one row per record: event id, time, the parsed order, and why it is
    invalid (null when valid), with the bytes a quarantine row keeps."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    headers = F.map_from_entries("headers")

    def header(name: str) -> Any:
        return F.element_at(headers, F.lit(name)).cast("string")

    order = F.from_json(F.col("value").cast("string"), ORDER_SCHEMA)
    rows = records.select(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        header("ce_id").alias("ce_id"),
        header("ce_type").alias("ce_type"),
        header("ce_time").try_cast("timestamp").alias("occurred_at"),
        order.alias("o"),
    )
    o = F.col("o")
    reason = (
        F.when(o.isNull(), "not_json")
        .when(~F.coalesce(F.col("ce_id").rlike(UUID), F.lit(False)), "bad_id")
        .when(F.coalesce(F.col("ce_type") != ORDER_TYPE, F.lit(True)), "unknown_type")
        .when(F.col("occurred_at").isNull(), "bad_time")
        .when(
            o.order_id.isNull() | o.customer_id.isNull() | o.currency.isNull() | o.amount.isNull(),
            "missing_field",
        )
        .when(F.coalesce(F.size(o.lines) < 1, F.lit(True)), "no_lines")
    )
    position = F.concat_ws(":", "topic", "partition", "offset")
    return rows.select(
        F.when(reason.isNull(), F.col("ce_id")).otherwise(position).alias("event_id"),
        "occurred_at",
        "o",
        reason.alias("reason"),
        F.when(reason.isNotNull(), F.col("key")).alias("key"),
        F.when(reason.isNotNull(), F.col("value")).alias("value"),
        "topic",
        "partition",
        "offset",
    )


def order_totals(valid: Any) -> Any:
    """Orders, items and amount per hour, customer and currency."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    items = F.aggregate("o.lines", F.lit(0).cast("long"), lambda n, line: n + line["quantity"])
    return (
        valid.groupBy(F.window("occurred_at", "1 hour").alias("w"), "o.customer_id", "o.currency")
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.sum(items).alias("items"),
            F.sum("o.amount").cast("decimal(38,2)").alias("amount"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "customer_id",
            "currency",
            "orders",
            "items",
            "amount",
        )
    )


def same_work(ctx: Any, name: str, modifiers: list[str], jdbc: Any) -> Any:
    """Run the same-work job available-now on a fresh checkpoint and tables; its report."""
    from pyspark import StorageLevel  # noqa: PLC0415

    from outboxkit.pipeline.job import report  # noqa: PLC0415

    url, props = jdbc
    with psycopg.connect(ctx.pg_url, autocommit=True) as conn:
        conn.execute(TOTALS_DDL.format(table=name).encode())
    records = (
        ctx.spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", ctx.bootstrap)
        .option("subscribe", ctx.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", ctx.batch)
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .load()
    )
    rows = validated(records)
    if "no-dedupe" not in modifiers:
        rows = rows.withWatermark("occurred_at", "1 hour").dropDuplicatesWithinWatermark(
            ["event_id"]
        )

    def write(batch: Any, batch_id: int) -> None:
        with psycopg.connect(ctx.pg_url) as conn:
            done = conn.execute(
                f"SELECT 1 FROM {name}_ledger WHERE batch_id = %s", (batch_id,)
            ).fetchone()
        if done:
            return
        persist = "no-persist" not in modifiers
        if persist:
            batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            if "no-quarantine" not in modifiers:
                bad = batch.where("reason IS NOT NULL").select(
                    "key", "value", "topic", "partition", "offset", "reason"
                )
                bad.write.jdbc(url, f"{name}_quarantine", mode="append", properties=props)
            totals = order_totals(batch.where("reason IS NULL"))
            if "noop-sink" in modifiers:
                totals.write.format("noop").mode("overwrite").save()
                return
            stage = {**props, "truncate": "true"}
            totals.write.jdbc(url, f"{name}_stage", mode="overwrite", properties=stage)
            with psycopg.connect(ctx.pg_url) as conn, conn.transaction():
                conn.execute(UPSERT.format(table=name).encode())
                conn.execute(f"INSERT INTO {name}_ledger VALUES (%s)".encode(), (batch_id,))
        finally:
            if persist:
                batch.unpersist()

    query = (
        rows.writeStream.queryName(name)
        .foreachBatch(write)
        .option("checkpointLocation", str(ctx.workdir / "checkpoints" / name))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception():
        raise SystemExit(f"{name} failed: {query.exception()}")
    with psycopg.connect(ctx.pg_url) as conn:
        found = conn.execute(
            f"SELECT (SELECT coalesce(sum(orders), 0) FROM {name}), "
            f"(SELECT count(*) FROM {name}_ledger), to_regclass('{name}_quarantine') IS NOT NULL"
        ).fetchone()
        assert found
        bad = found[2] and conn.execute(f"SELECT count(*) FROM {name}_quarantine").fetchone()
    print(
        f"    {name}: {found[0]:,} orders counted, {found[1]} batches in the ledger, "
        f"{bad[0] if bad else 0:,} quarantined"
    )
    return report(query)
