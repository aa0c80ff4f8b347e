"""Sinks: where each micro-batch's rows go, with re-runs that change nothing.

Spark re-runs a micro-batch after a crash when its checkpoint commit is missing; a sink must
then write nothing twice. Both sinks key that on ``(query id, batch id)``: the query id is the
checkpoint's (a new checkpoint is a new query), the batch id grows by one per micro-batch.

- :class:`PostgresSink` writes the rows in **one** transaction that also inserts
  ``(query id, batch id)`` into ``outboxkit.pipeline_batches`` (migration 0004): a re-run
  finds the row and skips the batch. The rows go in with ``COPY`` into a temporary table and
  one ``INSERT … ON CONFLICT`` (an upsert on ``keys``, adding the ``add`` columns), so a batch
  of aggregates costs one round trip per step, not one per row. Rows are collected to the
  driver: use it for aggregates, not raw events.
- :class:`DeltaSink` writes a Delta Lake table: an append, or a ``MERGE`` on ``keys`` that adds
  the ``add`` columns. Delta's idempotent writes (``txnAppId`` = query id + sink, ``txnVersion``
  = batch id) make a re-run of a committed batch a no-op, atomically with the data.

With ``add`` columns a sink can add increments (``orders = orders + excluded.orders``) and stay
exact, since every batch is applied once.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import psycopg
import structlog
from psycopg import sql

from outboxkit.pipeline.exceptions import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = structlog.get_logger("outboxkit.pipeline")

#: Batch-log rows older than this many batches are deleted (only the latest can be re-run).
KEEP_BATCHES = 100


@dataclass(frozen=True)
class BatchInfo:
    """The micro-batch a sink writes: its streaming query and its number."""

    query_id: str
    query_name: str
    batch_id: int
    settings_output: str
    """The pipeline's output root (:attr:`PipelineSettings.pipeline_output`)."""
    database_url: str | None


class Sink(Protocol):
    """Writes one micro-batch's rows; writing the same ``batch`` again must change nothing."""

    name: str

    def prepare(self, spark: SparkSession, output: str, database_url: str | None) -> None:
        """Called once before the query starts (create tables, check migrations…)."""

    def write(self, rows: DataFrame, batch: BatchInfo) -> bool:
        """Write ``rows``; ``False`` when the sink knows it wrote nothing (a batch it had
        already written, or no rows)."""


def _identifier(table: str) -> sql.Identifier:
    return sql.Identifier(*table.split("."))


class PostgresSink:
    """Upsert rows into a PostgreSQL table, each micro-batch once (see the module)."""

    def __init__(
        self,
        table: str,
        *,
        keys: Sequence[str],
        add: Sequence[str] = (),
        ddl: str | None = None,
        database_url: str | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        """``table`` (``schema.table`` allowed) must exist or be created by ``ddl`` (run at
        start). Columns are the DataFrame's; ``keys`` is the conflict target (a unique index),
        ``add`` the columns summed on conflict; the other columns are overwritten.
        ``database_url`` defaults to the pipeline's ``OUTBOXKIT_DATABASE_URL``."""
        self.name = f"postgresql:{table}"
        self.table = table
        self.keys = tuple(keys)
        self.add = tuple(add)
        self.ddl = ddl
        self.database_url = database_url
        self.connect_timeout = connect_timeout

    def _url(self, fallback: str | None) -> str:
        url = self.database_url or fallback
        if not url:
            raise PipelineError(f"{self.name}: no database URL; set OUTBOXKIT_DATABASE_URL")
        return url

    def prepare(self, spark: SparkSession, output: str, database_url: str | None) -> None:
        try:
            with psycopg.connect(self._url(database_url), connect_timeout=10) as conn:
                if self.ddl:
                    conn.execute(self.ddl.encode())
                found = conn.execute(
                    "SELECT to_regclass('outboxkit.pipeline_batches') IS NOT NULL"
                ).fetchone()
        except psycopg.Error as exc:
            raise PipelineError(f"{self.name}: preparing failed: {exc}") from exc
        if not (found and found[0]):
            raise PipelineError(
                "outboxkit.pipeline_batches is missing: run `outboxkit migrate` on this database"
            )

    def upsert_sql(self, columns: Sequence[str]) -> sql.Composed:
        """``INSERT … SELECT`` from the staging table, with the conflict rule."""
        target = _identifier(self.table)
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        updates = [
            sql.SQL("{c} = t.{c} + excluded.{c}").format(c=sql.Identifier(c))
            if c in self.add
            else sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c))
            for c in columns
            if c not in self.keys
        ]
        action = (
            sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(updates))
            if updates
            else sql.SQL("DO NOTHING")
        )
        return sql.SQL(
            "INSERT INTO {target} AS t ({names}) SELECT {names} FROM outboxkit_stage "
            "ON CONFLICT ({keys}) {action}"
        ).format(
            target=target,
            names=names,
            keys=sql.SQL(", ").join(map(sql.Identifier, self.keys)),
            action=action,
        )

    def write(self, rows: DataFrame, batch: BatchInfo) -> bool:
        import pyarrow.csv as pacsv  # noqa: PLC0415 (the [spark] extra)

        # Arrow keeps timestamps time-zone aware (collect() would give naive local times).
        table = rows.toArrow()
        buffer = io.BytesIO()
        if table.num_rows:
            options = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
            pacsv.write_csv(table, buffer, write_options=options)
        written = self.write_csv(batch, table.column_names, buffer.getvalue(), table.num_rows)
        logger.info(
            "batch written" if written else "batch already written, skipped",
            sink=self.name,
            query=batch.query_name,
            batch_id=batch.batch_id,
            rows=table.num_rows,
        )
        return written

    def write_csv(self, batch: BatchInfo, columns: Sequence[str], data: bytes, count: int) -> bool:
        """Apply one batch's rows (CSV, no header) unless the batch is in the log."""
        url = self._url(batch.database_url)
        with psycopg.connect(url, connect_timeout=max(1, round(self.connect_timeout))) as conn:
            with conn.transaction():
                claimed = conn.execute(
                    "INSERT INTO outboxkit.pipeline_batches "
                    "(query_id, batch_id, query_name, row_count) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING RETURNING batch_id",
                    (_log_id(batch.query_id, self.name), batch.batch_id, batch.query_name, count),
                ).fetchone()
                if claimed is None:
                    return False
                if count:
                    conn.execute(
                        sql.SQL(
                            "CREATE TEMPORARY TABLE outboxkit_stage ON COMMIT DROP AS "
                            "SELECT {names} FROM {target} WITH NO DATA"
                        ).format(
                            names=sql.SQL(", ").join(map(sql.Identifier, columns)),
                            target=_identifier(self.table),
                        )
                    )
                    copy_sql = sql.SQL("COPY outboxkit_stage ({}) FROM STDIN (FORMAT csv)").format(
                        sql.SQL(", ").join(map(sql.Identifier, columns))
                    )
                    with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
                        copy.write(data)
                    conn.execute(self.upsert_sql(columns))
                conn.execute(
                    "DELETE FROM outboxkit.pipeline_batches WHERE query_id = %s AND batch_id < %s",
                    (_log_id(batch.query_id, self.name), batch.batch_id - KEEP_BATCHES),
                )
            return True


def _log_id(query_id: str, sink: str) -> str:
    """The batch log's query id: one per (query, sink) — a UUID derived from both — so two
    sinks of one query each keep their own log."""
    return str(uuid.uuid5(uuid.UUID(query_id), sink))


class DeltaSink:
    """Append or merge rows into a Delta Lake table, each micro-batch once (see the module)."""

    def __init__(self, path: str, *, keys: Sequence[str] = (), add: Sequence[str] = ()) -> None:
        """``path``: a directory or URI; a relative path is under the pipeline's output root.
        Without ``keys`` the rows are appended; with them, merged (``add`` columns summed)."""
        self.name = f"delta:{path}"
        self.path = path
        self.keys = tuple(keys)
        self.add = tuple(add)
        if self.add and not self.keys:
            raise PipelineError(f"{self.name}: add columns need keys to merge on")

    def location(self, output: str) -> str:
        if "://" in self.path or self.path.startswith("/") or ":" in self.path.split("/")[0]:
            return self.path
        return f"{output.rstrip('/')}/{self.path}"

    def prepare(self, spark: SparkSession, output: str, database_url: str | None) -> None:
        pass  # the first batch creates the table

    def write(self, rows: DataFrame, batch: BatchInfo) -> bool:
        from delta.tables import DeltaTable  # noqa: PLC0415 (the [spark] extra)

        spark = rows.sparkSession
        path = self.location(batch.settings_output)
        app_id = f"{batch.query_id}/{self.name}"
        if rows.isEmpty():
            return False  # nothing to write: no Delta commit (each costs a log entry)
        # Delta skips a write whose (txnAppId, txnVersion) the table has already committed.
        if not self.keys or not DeltaTable.isDeltaTable(spark, path):
            (
                rows.write.format("delta")
                .mode("append")
                .option("txnAppId", app_id)
                .option("txnVersion", batch.batch_id)
                .save(path)
            )
        else:
            self._merge(DeltaTable.forPath(spark, path), rows, app_id, batch.batch_id)
        logger.info(
            "batch written", sink=self.name, query=batch.query_name, batch_id=batch.batch_id
        )
        return True

    def _merge(self, table: object, rows: DataFrame, app_id: str, batch_id: int) -> None:
        spark = rows.sparkSession
        on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.keys)
        updates = {
            c: (f"t.`{c}` + s.`{c}`" if c in self.add else f"s.`{c}`")
            for c in rows.columns
            if c not in self.keys
        }
        # Delta's idempotent DML: the merge commits with this (app id, version) transaction.
        spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            merge = table.alias("t").merge(rows.alias("s"), on)  # type: ignore[attr-defined]
            if updates:
                merge = merge.whenMatchedUpdate(set=updates)
            merge.whenNotMatchedInsertAll().execute()
        finally:
            spark.conf.unset("spark.databricks.delta.write.txnAppId")
            spark.conf.unset("spark.databricks.delta.write.txnVersion")
