-- The Spark pipeline's batch log: one row per micro-batch a foreachBatch sink has written.
--
-- Structured Streaming re-runs the last micro-batch after a crash when the batch's writes
-- committed but its checkpoint commit did not. The sink inserts (query_id, batch_id) in the
-- same transaction as its writes; a re-run finds the row (ON CONFLICT DO NOTHING inserts
-- nothing) and writes nothing, so increments are applied exactly once.
--
-- query_id is the streaming query's id, stored in its checkpoint: a new checkpoint is a new
-- query whose batch ids start again at 0 and must not collide with the old ones. Only the
-- latest batch can be re-run, so the sink deletes rows more than a few batches old in the same
-- transaction: the table stays small (G7).
CREATE TABLE outboxkit.pipeline_batches (
    query_id    uuid        NOT NULL,
    batch_id    bigint      NOT NULL,
    query_name  text        NOT NULL,
    row_count   integer     NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, batch_id)
);
