-- The operator's repairs on PostgreSQL (outboxkit outbox failed|retry|skip|replay); the relay
-- never runs them. Tables: migrations/files/postgres/0002_outbox.sql.

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
