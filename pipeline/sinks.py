"""The PostgreSQL sink: a ``foreachBatch`` writer whose re-runs are no-ops.

Each micro-batch is written in **one** transaction that also inserts ``(query id, batch id)``
into ``outboxkit.pipeline_batches`` (migration 0004). Spark re-runs a micro-batch after a crash
only when its checkpoint commit is missing; if the database transaction had committed, the
insert finds the row and the whole batch is skipped; if it had not, nothing of it is in the
database and it is written now. Either way each batch's rows are applied exactly once, so the
writer may add increments (``total = total + excluded.total``), not only overwrite.

The batch's rows are collected to the driver: this sink is for aggregates (one row per key and
window touched by the batch), not for raw events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import structlog
from psycopg.abc import Query

from outboxkit.pipeline.exceptions import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = structlog.get_logger("outboxkit.pipeline")

#: Batch-log rows older than this many batches are deleted (only the latest can be re-run).
KEEP_BATCHES = 100

_CLAIM_BATCH = """
INSERT INTO outboxkit.pipeline_batches (query_id, batch_id, query_name, row_count)
VALUES (%s, %s, %s, %s)
ON CONFLICT DO NOTHING
RETURNING batch_id
"""
_FORGET_OLD_BATCHES = """
DELETE FROM outboxkit.pipeline_batches WHERE query_id = %s AND batch_id < %s
"""

#: The local property Spark sets on the thread that runs a streaming query's micro-batches.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


class PostgresBatchSink:
    """``foreachBatch`` function: ``prepare`` the batch, then ``upsert`` its rows in one
    transaction gated by the batch log.

    ``prepare`` turns the micro-batch into the rows to write (e.g. aggregates it); ``statement``
    is executed once per row (``executemany``) and should be an idempotent-per-batch upsert.
    """

    def __init__(
        self,
        database_url: str,
        *,
        query_name: str,
        statement: Query,
        prepare: Callable[[DataFrame], DataFrame],
        columns: Sequence[str],
        connect_timeout: float = 10.0,
    ) -> None:
        self.database_url = database_url
        self.query_name = query_name
        self.statement = statement
        self.prepare = prepare
        self.columns = tuple(columns)
        self.connect_timeout = connect_timeout

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        query_id = batch.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        if not query_id:
            raise PipelineError(
                f"{self.query_name}: no streaming query id on this thread; "
                "PostgresBatchSink must run as a foreachBatch function"
            )
        # Arrow keeps timestamps time-zone aware (collect() would give naive local times).
        table = self.prepare(batch).toArrow()
        rows = [tuple(row[c] for c in self.columns) for row in table.to_pylist()]
        written = self.write(query_id, batch_id, rows)
        logger.info(
            "batch written" if written else "batch already written, skipped",
            query=self.query_name,
            batch_id=batch_id,
            rows=len(rows),
        )

    def write(self, query_id: str, batch_id: int, rows: Sequence[tuple[Any, ...]]) -> bool:
        """Write one batch's rows unless that batch is in the log; ``False`` when skipped."""
        with psycopg.connect(
            self.database_url, connect_timeout=max(1, round(self.connect_timeout))
        ) as conn:
            with conn.transaction():
                claimed = conn.execute(
                    _CLAIM_BATCH, (query_id, batch_id, self.query_name, len(rows))
                ).fetchone()
                if claimed is None:
                    return False
                if rows:
                    with conn.cursor() as cursor:
                        cursor.executemany(self.statement, rows)
                conn.execute(_FORGET_OLD_BATCHES, (query_id, batch_id - KEEP_BATCHES))
            return True
