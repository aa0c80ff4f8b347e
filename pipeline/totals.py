"""The example job: order totals per customer, currency and event-time window, from
:class:`~outboxkit.demo.events.OrderPlaced`.

Two sinks show the two usual readers:

- **a lake** (Parquet, append mode): one row per window, written once, when the watermark has
  passed the window's end — final values, never rewritten;
- **a serving table** (PostgreSQL, :class:`~outboxkit.pipeline.sinks.PostgresBatchSink`):
  every micro-batch adds its increments to the rows of the windows it touched, so totals are
  current within one trigger interval, and the batch log makes a re-run add nothing.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg import sql
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from outboxkit.demo.events import OrderPlaced
from outboxkit.pipeline.decode import event_column
from outboxkit.pipeline.settings import spark_duration

#: Columns of an order-totals row, in the lake and in the serving table.
COLUMNS = ("window_start", "window_end", "customer_id", "currency", "orders", "items", "amount")

_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    window_start timestamptz   NOT NULL,
    window_end   timestamptz   NOT NULL,
    customer_id  text          NOT NULL,
    currency     text          NOT NULL,
    orders       bigint        NOT NULL,
    items        bigint        NOT NULL,
    amount       numeric(38,2) NOT NULL,
    updated_at   timestamptz   NOT NULL DEFAULT now(),
    PRIMARY KEY (window_start, customer_id, currency)
)
"""
_ADD = """
INSERT INTO {table} AS t (window_start, window_end, customer_id, currency, orders, items, amount)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (window_start, customer_id, currency) DO UPDATE
SET orders = t.orders + excluded.orders,
    items = t.items + excluded.items,
    amount = t.amount + excluded.amount,
    updated_at = now()
"""


def table_identifier(table: str) -> sql.Identifier:
    return sql.Identifier(*table.split("."))


def create_table_sql(table: str) -> sql.Composed:
    """``CREATE TABLE IF NOT EXISTS`` of the serving table."""
    return sql.SQL(_DDL).format(table=table_identifier(table))


def add_totals_sql(table: str) -> sql.Composed:
    """The upsert that adds one batch's totals to the serving table."""
    return sql.SQL(_ADD).format(table=table_identifier(table))


def order_totals(events: DataFrame, window: timedelta) -> DataFrame:
    """Orders, items and amount per window, customer and currency (streaming or batch).

    ``events`` is a decoded DataFrame (one column per event model); rows of other types are
    ignored. On a streaming DataFrame, watermark ``occurred_at`` first.
    """
    order = F.col(event_column(OrderPlaced))
    items: Column = F.aggregate(
        order["lines"], F.lit(0).cast("long"), lambda total, line: total + line["quantity"]
    )
    placed = events.where(order.isNotNull()).select(
        "occurred_at",
        order["customer_id"].alias("customer_id"),
        order["currency"].alias("currency"),
        order["amount"].alias("amount"),
        items.alias("items"),
    )
    grouped = placed.groupBy(
        F.window("occurred_at", spark_duration(window)).alias("window"), "customer_id", "currency"
    ).agg(
        F.count(F.lit(1)).alias("orders"),
        F.sum("items").alias("items"),
        F.sum("amount").cast("decimal(38,2)").alias("amount"),
    )
    return grouped.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *COLUMNS[2:],
    )
