-- The wake-up trigger's WHEN condition, outboxkit.relay_is_waiting(), runs for every outbox row
-- a writer inserts. As a LANGUAGE sql function it is not inlined in a trigger's WHEN clause, so
-- PostgreSQL parses and plans its body again for every INSERT statement: with pgbench (8
-- clients, one business row + one outbox row per transaction) the writers lost 8-10 % of their
-- throughput to it while no relay was waiting. PL/pgSQL keeps the plan of its query for the
-- whole session: 1-7 % (4 % on average) in the same alternating A/B runs (docs/relay.md). Same name,
-- arguments and result, so the trigger (which refers to the function, not its text) is
-- unchanged.
CREATE OR REPLACE FUNCTION outboxkit.relay_is_waiting() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM outboxkit.relay_waiting);
END;
$$;
