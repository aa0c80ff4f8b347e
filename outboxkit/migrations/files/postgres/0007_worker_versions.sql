-- Rolling upgrades (docs/upgrading.md): release N-1 and release N run side by side against one
-- database while a deploy replaces one with the other, so each of them must be able to tell
-- whether the other can run beside the schema. Two columns, both added with no default and
-- nullable: an expand step. Release N-1 neither reads nor writes them, and its INSERTs (which
-- name their columns) leave them NULL.

-- The outboxkit release each relay runs (its __version__), written with its presence
-- (relay/postgres/presence.py). `outboxkit migrate --check` reads the live relays' versions
-- and says whether they can all run beside the migrations it would apply. NULL: a relay of a
-- release that announced no version (before this migration).
ALTER TABLE outboxkit.relay_members ADD COLUMN version text;

-- The oldest release that can run beside each applied migration: the release its contract
-- marker names (`-- contract: runs beside >= X.Y.Z`, outboxkit/migrations/compat.py), NULL for
-- an expand-only migration, which every release runs beside. A worker of an earlier release
-- that finds migrations it does not know reads this to decide whether it may start (before,
-- it refused any, so a relay of N-1 restarted during a rolling deploy after `outboxkit
-- migrate` could not come back). Written by the release that applies the migration.
ALTER TABLE outboxkit.schema_migrations ADD COLUMN runs_beside text;
