-- The relay's queries on PostgreSQL. Tables: migrations/postgresql/0002_outbox.sql.

-- register_topic --
-- Kept from Kafka's metadata by the relay. Writers compute each row's partition from it.
INSERT INTO outboxkit.topics (topic, partitions)
VALUES (%(topic)s, %(partitions)s)
ON CONFLICT (topic) DO UPDATE
    SET partitions = EXCLUDED.partitions, updated_at = now()
    WHERE outboxkit.topics.partitions IS DISTINCT FROM EXCLUDED.partitions

-- insert_event --
-- The writer's only statement, run in the caller's transaction. The partition comes from the
-- registered partition count and the key's murmur2 hash (computed in Python): Kafka's default
-- partitioner, toPositive(hash) % partitions. No row in outboxkit.topics → nothing inserted,
-- which the writer reports as an unknown topic.
INSERT INTO outboxkit.outbox
    (topic, partition, key, value, header_names, header_values, event_id, event_type)
SELECT t.topic, (%(key_hash)s::integer & 2147483647) %% t.partitions, %(key)s, %(value)s,
       %(header_names)s, %(header_values)s, %(event_id)s, %(event_type)s
FROM outboxkit.topics t
WHERE t.topic = %(topic)s

-- fetch_pending --
-- The head of one partition, oldest first, one record per key (the per-key barrier): the first
-- %(scan)s pending rows are read in id order from the partial index outbox_pending_idx, and only
-- the oldest row of each key in them is returned, so rows a batch cannot take are not shipped.
-- ORDER BY (topic, partition, id) rather than id alone: only outbox_pending_idx gives that order,
-- so the planner cannot switch to a primary-key scan through dead rows (seen after an
-- autoanalyze during a large drain: one partition stalled for 50 s).
-- No locks and no marks: only the partition's owner (its Kafka assignment) reads here, and
-- Kafka fences a stale owner. Keys with a failed record are skipped, so nothing overtakes a
-- parked record of its key.
SELECT id, topic, partition, key, value, header_names, header_values, event_id, attempts,
       created_at
FROM (
    SELECT DISTINCT ON (head.key) head.*
    FROM (
        SELECT o.id, o.topic, o.partition, o.key, o.value, o.header_names, o.header_values,
               o.event_id, o.attempts, o.created_at
        FROM outboxkit.outbox o
        WHERE o.topic = %(topic)s AND o.partition = %(partition)s AND o.state = 'pending'
          AND NOT EXISTS (
              SELECT 1 FROM outboxkit.outbox f
              WHERE f.state = 'failed' AND f.topic = o.topic AND f.partition = o.partition
                AND f.key = o.key
          )
        ORDER BY o.topic, o.partition, o.id
        LIMIT %(scan)s
    ) head
    ORDER BY head.key, head.id
) firsts
ORDER BY id
LIMIT %(limit)s

-- delete_published --
DELETE FROM outboxkit.outbox WHERE id = ANY(%(ids)s)

-- keep_published --
UPDATE outboxkit.outbox SET state = 'published', published_at = now()
WHERE id = ANY(%(ids)s) AND state = 'pending'

-- record_failure --
UPDATE outboxkit.outbox
SET attempts = attempts + 1,
    last_error = %(error)s,
    state = CASE WHEN %(give_up)s THEN 'failed' ELSE state END
WHERE id = %(id)s AND state = 'pending'

-- set_waiting --
INSERT INTO outboxkit.relay_waiting (topic, partition) VALUES (%(topic)s, %(partition)s)
ON CONFLICT DO NOTHING

-- writers_horizon --
-- Run right after set_waiting committed: every transaction with an id below this snapshot's
-- xmax began before the declaration was visible, so its trigger may have seen no waiting relay.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text

-- writers_settled --
-- True once every transaction below that horizon has ended: their rows are visible to the next
-- read, and every later writer's trigger saw the declaration (and notifies). A long transaction
-- anywhere on the server also holds xmin back; the relay stops waiting for it after a bound.
SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %(horizon)s::xid8

-- clear_waiting --
DELETE FROM outboxkit.relay_waiting WHERE topic = %(topic)s AND partition = %(partition)s

-- purge_published --
-- Small batches, oldest first, via outbox_published_idx: retention never holds long locks.
DELETE FROM outboxkit.outbox
WHERE id IN (
    SELECT id FROM outboxkit.outbox
    WHERE state = 'published' AND published_at < now() - %(older_than)s
    ORDER BY published_at
    LIMIT %(limit)s
)

-- backlog --
-- Pending rows come from the partial index; failed rows are few by construction.
SELECT topic, partition,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       min(created_at) FILTER (WHERE state = 'pending') AS oldest,
       count(*) FILTER (WHERE state = 'failed') AS failed
FROM outboxkit.outbox
WHERE state IN ('pending', 'failed')
GROUP BY topic, partition
ORDER BY topic, partition

-- list_records --
SELECT event_id, event_type, topic, partition, key, state, attempts, created_at, last_error,
       published_at
FROM outboxkit.outbox
WHERE state = %(state)s
ORDER BY id
LIMIT %(limit)s

-- retry_failed --
UPDATE outboxkit.outbox SET state = 'pending', attempts = 0, last_error = NULL
WHERE state = 'failed' AND event_id = ANY(%(event_ids)s)

-- skip_failed --
DELETE FROM outboxkit.outbox WHERE state = 'failed' AND event_id = ANY(%(event_ids)s)

-- replay --
-- A copy with a new id: it is published after everything already pending, never ahead of
-- newer events of its key. The event id stays, so inboxes that saw it absorb it.
INSERT INTO outboxkit.outbox
    (topic, partition, key, value, header_names, header_values, event_id, event_type)
SELECT topic, partition, key, value, header_names, header_values, event_id, event_type
FROM outboxkit.outbox
WHERE state = 'published' AND event_id = ANY(%(event_ids)s)
ORDER BY id
