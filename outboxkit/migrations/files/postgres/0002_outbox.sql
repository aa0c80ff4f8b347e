-- The outbox: one row per event a service committed and the relay has not yet published.
--
-- The writer inserts rows inside the service's own transaction (outboxkit.relay.Outbox); the
-- relay reads the head of each partition it owns, publishes in a Kafka transaction, then deletes
-- the rows (or keeps them as published, for replay, when a retention is configured).
-- Claiming needs no writes: ownership of a partition is the relay's Kafka group assignment and a
-- zombie is fenced by the partition's transactional.id, so a row costs one INSERT and one DELETE.

-- Partition counts of the topics the relay publishes to, kept from Kafka's metadata by the
-- relay. Writers read it (inside their INSERT, no extra round trip) to fix each row's partition
-- at write time, with Kafka's default partitioner: toPositive(murmur2(key)) % partitions.
CREATE TABLE outboxkit.topics (
    topic      text        PRIMARY KEY,
    partitions integer     NOT NULL CHECK (partitions > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outboxkit.outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic         text        NOT NULL,
    -- Fixed at write time, so that every row of a key stays in one partition (and one relay's
    -- hands) even if the topic later grows; see docs/relay.md.
    partition     integer     NOT NULL,
    key           bytea       NOT NULL,
    value         bytea,
    -- Kafka headers in order, duplicates allowed: two arrays of the same length.
    header_names  text[]      NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    event_id      uuid        NOT NULL,
    event_type    text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- 'pending' until published; 'failed' when the broker will never accept it (the error says
    -- why; an operator retries or skips it); 'published' only when a retention keeps such rows.
    state         text        NOT NULL DEFAULT 'pending'
                              CHECK (state IN ('pending', 'failed', 'published')),
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    published_at  timestamptz
);

-- The relay's claim reads the head of one partition: this partial index holds pending rows only,
-- so the claim stays an index range scan however many published or failed rows the table keeps.
CREATE INDEX outbox_pending_idx ON outboxkit.outbox (topic, partition, id)
    WHERE state = 'pending';

-- Failed rows block their key (per-key order); the claim checks this small index.
CREATE INDEX outbox_failed_idx ON outboxkit.outbox (topic, partition, key)
    WHERE state = 'failed';

-- Retention cleanup deletes the oldest published rows in small batches.
CREATE INDEX outbox_published_idx ON outboxkit.outbox (published_at)
    WHERE state = 'published';

-- Replay, retry and skip address records by event id.
CREATE INDEX outbox_event_id_idx ON outboxkit.outbox (event_id);

-- Wake-up signalling. NOTIFY takes a database-wide lock at commit and serializes committing
-- writers, so writers notify only a relay that has declared itself idle: a busy relay reads the
-- head again anyway. One row per (topic, partition) a relay waits on; UNLOGGED because it is a
-- hint, rebuilt by the relay after a crash, and must not cost WAL.
CREATE UNLOGGED TABLE outboxkit.relay_waiting (
    topic     text    NOT NULL,
    partition integer NOT NULL,
    PRIMARY KEY (topic, partition)
);

-- Writers pay for this trigger on every insert, so its common case must cost next to nothing:
-- while no relay waits (under load relays are busy), the WHEN condition — a plain SQL function,
-- no PL/pgSQL call — is false and the trigger body never runs. Only then does the body check the
-- row's own partition and NOTIFY its relay. (Measured with pgbench, 8 clients: see docs/relay.md.)
CREATE FUNCTION outboxkit.relay_is_waiting() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM outboxkit.relay_waiting)
$$;

CREATE FUNCTION outboxkit.wake_relay() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM outboxkit.relay_waiting w
        WHERE w.topic = NEW.topic AND w.partition = NEW.partition
    ) THEN
        -- Several rows of one partition in a transaction send one notification: PostgreSQL
        -- folds identical (channel, payload) pairs.
        PERFORM pg_notify('outboxkit_outbox', NEW.topic || '/' || NEW.partition);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_wake_relay
    AFTER INSERT ON outboxkit.outbox
    FOR EACH ROW
    WHEN (outboxkit.relay_is_waiting())
    EXECUTE FUNCTION outboxkit.wake_relay();
