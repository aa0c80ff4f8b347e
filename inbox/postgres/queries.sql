-- The inbox's queries on PostgreSQL. Table: migrations/files/postgres/0003_inbox.sql.

-- insert_dedupe_record --
-- In the handler's transaction. A conflict means this consumer took effect for the event
-- before (a relay re-send, a redelivery after a crash, a replay): nothing is inserted and the
-- handler is skipped. The row lock of a concurrent insert of the same key makes the second
-- transaction wait and then see the conflict, so two workers never both run the handler.
INSERT INTO outboxkit.inbox (consumer, event_id, event_type, topic, partition, "offset")
VALUES (%(consumer)s, %(event_id)s, %(event_type)s, %(topic)s, %(partition)s, %(offset)s)
ON CONFLICT (consumer, event_id) DO NOTHING

-- insert_dedupe_records --
-- A whole batch in one statement (one round trip instead of one per record). Sorted by event
-- id, so two workers recording overlapping batches during a rebalance take the primary-key
-- locks in the same order and cannot deadlock. A duplicate inside the batch conflicts with its
-- first copy. RETURNING lists the events that are new for this consumer (as text: the
-- worker compares them with the ids it sent, also text). The columns come as array literals.
INSERT INTO outboxkit.inbox (consumer, event_id, event_type, topic, partition, "offset")
SELECT %(consumer)s, e.event_id, e.event_type, e.topic, e.partition, e.record_offset
FROM unnest(
    %(event_ids)s::uuid[], %(event_types)s::text[], %(topics)s::text[],
    %(partitions)s::integer[], %(offsets)s::bigint[]
) AS e(event_id, event_type, topic, partition, record_offset)
ORDER BY e.event_id
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING event_id::text

-- insert_partition_dedupe_records --
-- insert_dedupe_records for a batch of one topic-partition (what the worker sends): the topic
-- and the partition as two parameters instead of two arrays as long as the batch.
INSERT INTO outboxkit.inbox (consumer, event_id, event_type, topic, partition, "offset")
SELECT %(consumer)s, e.event_id, e.event_type, %(topic)s, %(partition)s, e.record_offset
FROM unnest(%(event_ids)s::uuid[], %(event_types)s::text[], %(offsets)s::bigint[])
    AS e(event_id, event_type, record_offset)
ORDER BY e.event_id
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING event_id::text

-- delete_dedupe_records --
-- Takes back the dedupe records this transaction inserted for events whose handlers it did not
-- run (the batch stopped growing at its time budget): deleting rows the transaction inserted
-- itself leaves the table as it was, and the events go in the next transaction.
DELETE FROM outboxkit.inbox
WHERE consumer = %(consumer)s AND event_id = ANY(%(event_ids)s::uuid[])

-- session_limits --
-- The limits past which PostgreSQL ends a transaction (and the session), in milliseconds, 0 for
-- none: set on the role, the database or the server. transaction_timeout is PostgreSQL 17+.
SELECT name, setting::bigint FROM pg_settings
WHERE name IN ('transaction_timeout', 'idle_in_transaction_session_timeout')

-- purge --
-- Oldest first through inbox_received_at_idx, in small batches that never hold long locks.
DELETE FROM outboxkit.inbox
WHERE ctid IN (
    SELECT ctid FROM outboxkit.inbox
    WHERE received_at < now() - %(older_than)s
    ORDER BY received_at
    LIMIT %(limit)s
)

-- count --
SELECT count(*) FROM outboxkit.inbox WHERE consumer = %(consumer)s

-- ping --
-- Whether the database answers: a worker that left its group because its transactions failed
-- (OUTBOXKIT_STEP_ASIDE_AFTER) asks before it rejoins. Touches no table.
SELECT 1
