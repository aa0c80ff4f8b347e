"""Phase ``writer``: what the wake-up trigger costs the service's writers (pgbench).

8 clients, ``-M prepared``, rounds alternating the variants, tables emptied and CHECKPOINT before
each run. One transaction = one business insert + the writer's outbox insert as ``queries.sql``
has it (a real event's value and headers; pgbench cannot compute murmur2, so the key hash is
random). (a) no trigger; (b) our trigger, no relay waiting (a busy relay); (c) our trigger with
every partition waiting and a listener reading every notification; (d) a naive row trigger that
always NOTIFYs, with the same listener. PostgreSQL only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import statistics
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from bench.relay_bench.harness import SOURCE, Ctx, Result, make_event, say
from bench.relay_bench.outbox import PostgresBenchOutbox, create_database, q
from outboxkit.embedded.postgres import postgres_bin_dir
from outboxkit.migrations import load_migrations
from outboxkit.relay.postgres.storage import CHANNEL
from outboxkit.schemas import encode

WRITER_DB = "outboxkit_bench_writer"
WRITER_TOPIC = "bench.orders"


def postgres(ctx: Ctx) -> PostgresBenchOutbox:
    if not isinstance(ctx.outbox, PostgresBenchOutbox):
        raise RuntimeError("this phase measures PostgreSQL itself")
    return ctx.outbox


async def connect(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


def _bytea(data: bytes) -> str:
    return f"'\\x{data.hex()}'::bytea"


def pgbench_script(keys: int) -> str:
    """One business insert and one outbox insert per transaction: the writer's statement as
    queries.sql has it (INSERT … SELECT … FROM outboxkit.topics), with a real encoded event's
    value and headers. pgbench cannot compute murmur2, so the key hash is a random int."""
    wire = encode(make_event(random.Random(5), keys, WRITER_TOPIC), source=SOURCE)
    names = "ARRAY[" + ", ".join(f"'{name}'" for name, _ in wire.headers) + "]::text[]"
    values = "ARRAY[" + ", ".join(_bytea(value) for _, value in wire.headers) + "]"
    return f"""\
\\set k random(0, {keys - 1})
\\set h random(-2147483648, 2147483647)
\\set cents random(100, 100000)
BEGIN;
INSERT INTO bench_orders (customer_id, amount) VALUES ('customer-' || :k, :cents / 100.0);
INSERT INTO outboxkit.outbox
    (topic, partition, key, value, header_names, header_values, event_id, event_type)
SELECT t.topic, (:h::integer & 2147483647) % t.partitions, convert_to('customer-' || :k, 'UTF8'),
       {_bytea(wire.value)}, {names}, {values}, gen_random_uuid(), 'bench.order_placed'
FROM outboxkit.topics t
WHERE t.topic = '{WRITER_TOPIC}';
END;
"""


def _our_trigger_sql() -> str:
    """CREATE TRIGGER outbox_wake_relay, as the migration has it."""
    for migration in load_migrations():
        found = re.search(r"CREATE TRIGGER outbox_wake_relay.*?;", migration.sql, re.S)
        if found:
            return found.group(0)
    raise RuntimeError("no CREATE TRIGGER outbox_wake_relay in the migrations")


NAIVE_TRIGGER = """
CREATE OR REPLACE FUNCTION bench.notify_always() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outboxkit_outbox', NEW.topic || '/' || NEW.partition);
    RETURN NULL;
END;
$$;
CREATE TRIGGER bench_notify_always AFTER INSERT ON outboxkit.outbox
    FOR EACH ROW EXECUTE FUNCTION bench.notify_always();
"""

WRITER_VARIANTS = {
    "a": "no trigger",
    "b": "our trigger, relay busy (none waiting)",
    "c": "our trigger, relay waiting + LISTEN",
    "d": "naive pg_notify per row + LISTEN",
}


class Listener:
    """A LISTENing session that reads every notification (as an idle relay would)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> Listener:
        self._task = asyncio.create_task(self._listen())
        await asyncio.wait_for(self._ready.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _listen(self) -> None:
        async with await connect(self.url) as conn:
            await conn.execute(q(f"LISTEN {CHANNEL}"))
            self._ready.set()
            async for _ in conn.notifies():
                self.count += 1


async def run_pgbench(ctx: Ctx, script: Path, seconds: int) -> float:
    info = psycopg.conninfo.conninfo_to_dict(postgres(ctx).admin_url)
    argv = [
        str(postgres_bin_dir() / "pgbench"),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(ctx.args.pgbench_clients),
        "-j",
        str(min(ctx.args.pgbench_clients, os.cpu_count() or 1)),
        "-T",
        str(seconds),
        "-f",
        str(script),
        "-h",
        str(info.get("host", "127.0.0.1")),
        "-p",
        str(info.get("port", 5432)),
        "-U",
        str(info.get("user", "postgres")),
        WRITER_DB,
    ]
    env = {**os.environ}
    if info.get("password"):
        env["PGPASSWORD"] = str(info["password"])
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    text = out.decode()
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{text}\n{err.decode()}")
    return float(found.group(1))


async def set_writer_variant(conn: psycopg.AsyncConnection[Any], variant: str, parts: int) -> None:
    await conn.execute("DROP TRIGGER IF EXISTS outbox_wake_relay ON outboxkit.outbox")
    await conn.execute("DROP TRIGGER IF EXISTS bench_notify_always ON outboxkit.outbox")
    await conn.execute("DELETE FROM outboxkit.relay_waiting")
    if variant in ("b", "c"):
        await conn.execute(q(_our_trigger_sql()))
    if variant == "c":
        await conn.execute(
            "INSERT INTO outboxkit.relay_waiting (topic, partition) "
            "SELECT %s, p FROM generate_series(0, %s - 1) p",
            (WRITER_TOPIC, parts),
        )
    if variant == "d":
        await conn.execute(q(NAIVE_TRIGGER))


async def phase_writer(ctx: Ctx) -> None:
    args = ctx.args
    admin_url = postgres(ctx).admin_url
    await create_database(admin_url, WRITER_DB)
    url = urlsplit(admin_url)._replace(path=f"/{WRITER_DB}").geturl()
    await PostgresBenchOutbox(admin_url, WRITER_DB).register_topic(WRITER_TOPIC, args.partitions)
    script = ctx.workdir / "writer.pgbench.sql"
    script.write_text(pgbench_script(args.keys))
    async with await connect(url) as conn:
        await conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        await conn.execute(
            "CREATE TABLE bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "customer_id text NOT NULL, amount numeric(12, 2) NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        tps: dict[str, list[float]] = {v: [] for v in WRITER_VARIANTS}
        notified: dict[str, int] = dict.fromkeys(WRITER_VARIANTS, 0)
        say(
            f"pgbench: {args.pgbench_clients} clients, -T {args.pgbench_seconds}, "
            f"{args.pgbench_rounds} rounds alternating a b c d, -M prepared; tables emptied "
            "and CHECKPOINT before each run"
        )
        try:
            for round_no in range(1, args.pgbench_rounds + 1):
                for variant, label in WRITER_VARIANTS.items():
                    await set_writer_variant(conn, variant, args.partitions)
                    await conn.execute("TRUNCATE bench_orders, outboxkit.outbox")
                    await conn.execute("CHECKPOINT")
                    async with contextlib.AsyncExitStack() as stack:
                        listener = None
                        if variant in ("c", "d"):
                            listener = await stack.enter_async_context(Listener(url))
                        result = await run_pgbench(ctx, script, args.pgbench_seconds)
                        await asyncio.sleep(0.2)
                        if listener is not None:
                            notified[variant] += listener.count
                    tps[variant].append(result)
                    say(f"  round {round_no} ({variant}) {label}: {result:,.0f} tps")
        finally:
            await set_writer_variant(conn, "b", args.partitions)
    base = statistics.mean(tps["a"])
    for variant, label in WRITER_VARIANTS.items():
        mean = statistics.mean(tps[variant])
        spread = f"{min(tps[variant]):,.0f}-{max(tps[variant]):,.0f}"
        note = f"rounds {spread}"
        if variant in ("c", "d"):
            runs = args.pgbench_rounds * args.pgbench_seconds
            note += f"; {notified[variant] / runs:,.0f} notifications/s received"
        if variant == "b":
            note += "; goal ≤ 5% loss vs (a)"
        ctx.add(
            Result(
                "writer",
                f"({variant}) {label}",
                f"{mean:,.0f} tps",
                f"{mean / base:.3f}x (a)",
                note,
            )
        )
    say("  means: " + ", ".join(f"({v}) {statistics.mean(t):,.0f} tps" for v, t in tps.items()))


# -- phase 5: claim strategies -----------------------------------------------------------------
