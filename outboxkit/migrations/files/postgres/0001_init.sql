-- outboxkit keeps its tables in a schema of its own, so they never collide with a service's
-- tables and can be granted, dumped or dropped as one.
CREATE SCHEMA IF NOT EXISTS outboxkit;

-- One row per applied migration. `outboxkit migrate` applies the missing ones in order, each in
-- its own transaction, under an advisory lock so that two deploys migrating at once serialize.
CREATE TABLE outboxkit.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
