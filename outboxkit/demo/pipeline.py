"""The demo's Spark job: order totals per customer, currency and hour, from
:class:`~outboxkit.demo.events.OrderPlaced` — an example of :mod:`outboxkit.pipeline`'s public
API, and what ``outboxkit pipeline run --job outboxkit.demo.pipeline:order_totals`` runs.

Each micro-batch's valid, deduplicated orders are summed per window, customer and currency;
both sinks *add* those increments to their rows, which is exact because each batch is applied
once. So the PostgreSQL table and the Delta table ``<output>/order_totals`` always hold the
current totals, equal to a recount of the distinct events (late events excepted).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from outboxkit.demo.events import OrderPlaced, registry
from outboxkit.pipeline import DeltaSink, Output, Pipeline, PipelineSettings, PostgresSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TABLE = "shop_order_totals"
WINDOW = timedelta(hours=1)
#: Columns of an order-totals row, in the lake and in the serving table.
COLUMNS = ("window_start", "window_end", "customer_id", "currency", "orders", "items", "amount")
KEYS = ("window_start", "customer_id", "currency")
ADDED = ("orders", "items", "amount")

DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    window_start timestamptz   NOT NULL,
    window_end   timestamptz   NOT NULL,
    customer_id  text          NOT NULL,
    currency     text          NOT NULL,
    orders       bigint        NOT NULL,
    items        bigint        NOT NULL,
    amount       numeric(38,2) NOT NULL,
    PRIMARY KEY (window_start, customer_id, currency)
)
"""


def totals(events: DataFrame, window: timedelta = WINDOW) -> DataFrame:
    """Orders, items and amount per window, customer and currency (rows of other types are
    ignored)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 (the [spark] extra)

    from outboxkit.pipeline import event_column  # noqa: PLC0415

    order = F.col(event_column(OrderPlaced))
    items = F.aggregate(
        order["lines"], F.lit(0).cast("long"), lambda total, line: total + line["quantity"]
    )
    seconds = int(window.total_seconds())
    placed = events.where(order.isNotNull()).select(
        F.window("occurred_at", f"{seconds} seconds").alias("window"),
        order["customer_id"].alias("customer_id"),
        order["currency"].alias("currency"),
        order["amount"].alias("amount"),
        items.alias("items"),
    )
    return (
        placed.groupBy("window", "customer_id", "currency")
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.sum("items").alias("items"),
            F.sum("amount").cast("decimal(38,2)").alias("amount"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            *COLUMNS[2:],
        )
    )


def order_totals(settings: PipelineSettings, *, table: str = TABLE) -> Pipeline:
    """The demo's pipeline: order totals into PostgreSQL (when a database URL is set) and
    into the Delta table ``<output>/order_totals``."""
    sinks: list[DeltaSink | PostgresSink] = [DeltaSink("order_totals", keys=KEYS, add=ADDED)]
    if settings.database_url:
        sinks.append(PostgresSink(table, keys=KEYS, add=ADDED, ddl=DDL.format(table=table)))
    return Pipeline(registry, [Output("order_totals", totals, sinks)])
