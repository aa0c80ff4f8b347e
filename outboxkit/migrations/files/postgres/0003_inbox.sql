-- The inbox: one row per event an inbox consumer has taken effect for.
--
-- The consumer inserts the row and runs the handler in one transaction; a second delivery of the
-- same event id finds the row (ON CONFLICT DO NOTHING inserts nothing) and skips the handler.
-- Only after that transaction commits does the consumer commit the Kafka offset.
CREATE TABLE outboxkit.inbox (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    event_type  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    -- The dedupe key: per consumer, so two services (or two inboxes of one) each take effect once.
    PRIMARY KEY (consumer, event_id)
);

-- TTL cleanup deletes the oldest rows in small batches through this index. A duplicate that
-- arrives after its row was cleaned up is processed again: keep the retention longer than the
-- longest redelivery window (relay retention + replay policy).
CREATE INDEX inbox_received_at_idx ON outboxkit.inbox (received_at);
