-- Relays of one group tell each other that one of them died, sooner than Kafka can.
--
-- Kafka notices a dead consumer-group member only when its session times out (10 s by default,
-- at least the broker's group.min.session.timeout.ms, 6 s by default), and every rebalance
-- waits for it until then: with relays restarting faster than that, the group never settles.
-- PostgreSQL notices at once: a killed process's sockets are closed by its kernel, and the
-- server ends the session and releases its session-level advisory locks.
--
-- So each relay writes its member id here and holds the advisory lock lock_key for as long as
-- its presence session lives. A survivor that can take that lock (pg_try_advisory_xact_lock,
-- released at the end of its statement) knows the session has ended and asks Kafka to remove
-- the member (LeaveGroup on its behalf). A relay that only lost its connection is removed
-- too: it cannot publish without the database anyway, rejoins as a new member, and its old
-- producer is fenced by the next owner like any zombie's (G4). Only the relays' own database
-- sessions are trusted, never a timeout: a member whose row is missing is left to Kafka.
CREATE TABLE outboxkit.relay_members (
    group_id     text        NOT NULL,
    member_id    text        NOT NULL,
    -- A 64-bit hash of (group_id, member_id), computed by the relay. Two members sharing a key
    -- (or another application's lock on it) can only make a death go unnoticed here, never
    -- make a live member look dead: a held lock always reads as alive.
    lock_key     bigint      NOT NULL,
    announced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, member_id)
);
