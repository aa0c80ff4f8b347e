-- The relay's queries on PostgreSQL. Tables: migrations/files/postgres/0002_outbox.sql.

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

-- settle_and_claim --
-- One statement per relay cycle: settle what Kafka has accepted (%(published)s): delete it, or
-- with a retention (%(keep)s) mark it published and keep it for replay; then read the
-- head of every partition in (%(topics)s, %(partitions)s), oldest first: the oldest records of
-- at most %(limit)s keys per partition, at most %(depth)s of each key (the relay publishes them
-- one per key per Kafka transaction, the per-key barrier, settling each before the next). The DELETE commits with the statement, before the relay publishes
-- the next record of any key: a crash never puts an older record after a newer one (G2).
-- Both parts see one snapshot, so the SELECT excludes the rows being deleted by id and finds
-- their keys' next records.
-- Per partition, the first %(scan)s pending rows are read in id order from the partial index
-- outbox_pending_idx; of each key among them the oldest %(depth)s are returned (a prefix in id
-- order: a key's records come with none skipped), for the %(limit)s keys whose oldest row comes
-- first. No locks and no marks: only the partition's owner (its
-- Kafka assignment) reads here, and Kafka fences a stale owner. Keys with a failed record are
-- skipped, so nothing overtakes a parked record of its key.
-- The partition is bounded by a row comparison on (partition, id), not `partition = …`: with
-- an equality the planner treats the partition as a constant, so the primary key's id order
-- also satisfies ORDER BY (topic, partition, id), and once autoanalyze sees one partition hold
-- most of the rows it scans outbox_pkey from the lowest id, filtering every other partition's
-- rows and every deleted row not yet vacuumed out (seen in the plans of the drain benchmark;
-- test_relay_claim_plan.py). Only outbox_pending_idx gives (partition, id) order, whatever the
-- statistics say. Row ids start at 1, so [(p, 0), (p + 1, 0)) is exactly partition p.
-- The keys a failed record blocks are read once per partition (outbox_failed_idx, few rows) into
-- an array, not as a NOT EXISTS per row: a plan made while the outbox was empty — a generic plan
-- that psycopg's prepared statement caches while idle relays poll an empty table — ran that
-- anti-join as a nested loop with a sequential scan of the whole outbox for every pending row,
-- and kept running it on the first read after a backlog arrived (no ANALYZE had invalidated it
-- yet): 16,000 rows x 100,000 rows, a partition stuck for 50 s to minutes on CPU (the drain
-- benchmark's intermittent stall; test_relay_claim_plan.py). Whatever the plan, the read is now
-- linear in the rows it looks at.
-- Of those, in id order, records while the bytes of the ones before them (key, value, header
-- names and values, as relay/limits.py's record_bytes counts them) stay under %(max_bytes)s: a
-- claim's memory is bounded in bytes as well as records, a partition always gets its first
-- record, and what a key gets is still a prefix of its records (G8).
-- The relay plans every execution (plan_cache_mode=force_custom_plan), so %(keep)s is a
-- constant to the planner and the CTE it turns off is not run at all.
WITH deleted AS (
    DELETE FROM outboxkit.outbox
    WHERE id = ANY(%(published)s::bigint[]) AND NOT %(keep)s::boolean
), kept AS (
    UPDATE outboxkit.outbox SET state = 'published', published_at = now()
    WHERE id = ANY(%(published)s::bigint[]) AND %(keep)s::boolean AND state = 'pending'
)
SELECT h.id, h.topic, h.partition, h.key, h.value, h.header_names, h.header_values,
       h.event_id, h.attempts, h.created_at
FROM unnest(%(topics)s::text[], %(partitions)s::integer[]) AS p(topic, partition)
CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(f.key), '{}') AS keys
    FROM outboxkit.outbox f
    WHERE f.state = 'failed' AND f.topic = p.topic AND f.partition = p.partition
) held
CROSS JOIN LATERAL (
    SELECT sized.id, sized.topic, sized.partition, sized.key, sized.value,
           sized.header_names, sized.header_values, sized.event_id, sized.attempts,
           sized.created_at
    FROM (
    SELECT ranked.*,
           coalesce(sum(octet_length(ranked.key) + coalesce(octet_length(ranked.value), 0)
                        + (SELECT coalesce(sum(octet_length(n)), 0)
                           FROM unnest(ranked.header_names) n)
                        + (SELECT coalesce(sum(octet_length(v)), 0)
                           FROM unnest(ranked.header_values) v))
                    OVER (ORDER BY ranked.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                    0) AS bytes_before
    FROM (
        SELECT keyed.*, dense_rank() OVER (ORDER BY keyed.head_id) AS key_order
        FROM (
            SELECT head.*,
                   row_number() OVER (PARTITION BY head.key ORDER BY head.id) AS depth,
                   min(head.id) OVER (PARTITION BY head.key) AS head_id
            FROM (
                SELECT o.id, o.topic, o.partition, o.key, o.value, o.header_names,
                       o.header_values, o.event_id, o.attempts, o.created_at
                FROM outboxkit.outbox o
                WHERE o.topic = p.topic AND o.state = 'pending'
                  AND (o.partition, o.id) >= (p.partition, 0)
                  AND (o.partition, o.id) < (p.partition + 1, 0)
                  AND o.id <> ALL(%(published)s::bigint[])
                  AND o.key <> ALL(held.keys)
                ORDER BY o.topic, o.partition, o.id
                LIMIT %(scan)s
            ) head
        ) keyed
        WHERE keyed.depth <= %(depth)s
    ) ranked
    WHERE ranked.key_order <= %(limit)s
    ) sized
    WHERE sized.bytes_before < %(max_bytes)s
    ORDER BY sized.id
) h

-- record_failure --
UPDATE outboxkit.outbox
SET attempts = attempts + 1,
    last_error = %(error)s,
    state = CASE WHEN %(give_up)s THEN 'failed' ELSE state END
WHERE id = %(id)s AND state = 'pending'

-- set_waiting --
-- Also run again, at each sweep and after the listener reconnects, by a relay that believes
-- itself declared: the rows it inserts (its row count) are declarations the table had lost. The
-- table is unlogged: a crash restart empties it, and a promoted standby never had its rows.
INSERT INTO outboxkit.relay_waiting (topic, partition)
SELECT * FROM unnest(%(topics)s::text[], %(partitions)s::integer[])
ON CONFLICT DO NOTHING

-- writers_horizon --
-- Run right after set_waiting committed: every transaction with an id below this snapshot's
-- xmax began before the declaration was visible, so its trigger may have seen no waiting relay.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text

-- earlier_writers_ended --
-- True once every transaction below that horizon has ended: their rows are visible to the next
-- read, and every later writer's trigger saw the declaration (and notifies). A long transaction
-- anywhere on the server also holds xmin back; the relay stops waiting for it after a bound.
SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %(horizon)s::xid8

-- clear_waiting --
DELETE FROM outboxkit.relay_waiting
WHERE (topic, partition) IN (
    SELECT * FROM unnest(%(topics)s::text[], %(partitions)s::integer[])
)

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
-- Pending rows come from the partial index; failed rows are few by construction. The oldest
-- pending row's age is measured on the server's clock (created_at is the writer's now()), so a
-- relay whose own clock is off never takes a partition for stalled early, or late.
-- Two reads, each with its own state = '…' condition so that each can use its partial index:
-- with one `state IN ('pending', 'failed')` neither index applies, and the whole table was
-- scanned, the published rows a retention keeps included (990,000 kept and 10,000 pending:
-- 348 ms, and 8.7 ms this way, bench/console.py's machine). It costs what is pending.
SELECT topic, partition, sum(pending)::bigint AS pending, min(oldest) AS oldest,
       sum(failed)::bigint AS failed,
       extract(epoch FROM clock_timestamp() - min(oldest)) AS oldest_age
FROM (
    SELECT topic, partition, count(*) AS pending, min(created_at) AS oldest, 0 AS failed
    FROM outboxkit.outbox
    WHERE state = 'pending'
    GROUP BY topic, partition
    UNION ALL
    SELECT topic, partition, 0, NULL, count(*)
    FROM outboxkit.outbox
    WHERE state = 'failed'
    GROUP BY topic, partition
) AS counted
GROUP BY topic, partition
ORDER BY topic, partition

-- announce_member --
-- Run on the relay's presence session, which holds the advisory lock %(lock_key)s from now on
-- (migrations/files/postgres/0006_relay_members.sql); replaces the member id it announced before.
-- version: this relay's outboxkit release, which `outboxkit migrate --check` reads (0007).
WITH gone AS (
    DELETE FROM outboxkit.relay_members
    WHERE group_id = %(previous_group)s AND member_id = %(previous)s
)
INSERT INTO outboxkit.relay_members (group_id, member_id, lock_key, version)
VALUES (%(group)s, %(member)s, %(lock_key)s, %(version)s)
ON CONFLICT (group_id, member_id) DO UPDATE SET lock_key = EXCLUDED.lock_key,
    version = EXCLUDED.version

-- member_versions --
-- The release each announced member of a group runs (the console shows it beside the
-- partitions the member owns); a few rows, by the primary key.
SELECT member_id, version FROM outboxkit.relay_members WHERE group_id = %(group)s

-- departed_members --
-- Members of the group whose presence session has ended: nobody holds their lock, so this
-- statement gets it (and releases it when it ends, autocommit). Run on the relay's own presence
-- session, which would get its own lock again (advisory locks are reentrant): its row is
-- skipped. Nothing is deleted here: a departure is forgotten (forget_members) only once Kafka
-- has been told, so one found while the broker is down is still found when it is back.
SELECT member_id FROM outboxkit.relay_members
WHERE group_id = %(group)s AND member_id <> %(own)s AND pg_try_advisory_xact_lock(lock_key)

-- forget_members --
-- Departures the relay has removed from Kafka's group. The lock is tried again: a relay that
-- only lost its session and announced itself again since is alive, and keeps its row.
DELETE FROM outboxkit.relay_members
WHERE group_id = %(group)s AND member_id = ANY(%(members)s) AND pg_try_advisory_xact_lock(lock_key)

-- running_versions --
-- The outboxkit release of each relay whose presence session lives (its lock is held: this
-- statement cannot take it), for `outboxkit migrate --check`. NULL: a relay of a release that
-- announced no version, or of any release before migration 0007 added the column (the row as
-- JSON has no such key then: the same query on either schema).
SELECT to_jsonb(m) ->> 'version' AS version, count(*)
FROM outboxkit.relay_members m
WHERE NOT pg_try_advisory_xact_lock(m.lock_key)
GROUP BY 1
