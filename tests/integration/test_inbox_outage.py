"""An inbox worker of 24 partitions across a crash restart of its PostgreSQL server: it reports
the outage on /healthz while it lasts, and applies effects again as soon as the database
answers.

Before, the worker sat idle 3 to 17 s after the database answered (24 partitions; 0 to 3 s with
6): psycopg_pool lent its dead idle connections first and waited 0, 1, 2, 4 s between the
failed checks, re-added lost connections 1, 2, 4, 8 s apart, and after OUTBOXKIT_CONNECT_TIMEOUT
the worker paused a fixed OUTBOXKIT_RETRY_BACKOFF_MAX more; /healthz stayed 200 for the first
10 s of the stall (core/postgres.py's RecoveringPool, inbox/transactions.py's outage_pause)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

from outboxkit.embedded._process import free_port
from outboxkit.embedded.postgres import EmbeddedPostgres
from tests.helpers import http_client, wait_for
from tests.integration.conftest import MakeTopic, migrate_database
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    InboxTables,
    create_effects_table,
    group_of,
    inbox_env,
    produce,
    wait_caught_up,
)

#: Seconds the database is down: what the promotion of a standby took in the measurements
#: that found the stall (a kill, then ``pg_ctl promote`` 2 s later).
DOWN = 2.1

#: The target: effects again within this many seconds of the database answering.
AGAIN_WITHIN = 2.0


async def test_an_inbox_worker_of_24_partitions_applies_effects_again_as_the_database_answers(
    pg_factory: Callable[[], EmbeddedPostgres],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    """Would catch a worker that waits on dead pooled connections or a fixed pause after the
    database answers (effects more than AGAIN_WITHIN later), whose /healthz says nothing of the
    outage while it lasts or stays 503 once the database answers, or that loses or repeats an
    effect (G6)."""
    server = await asyncio.to_thread(pg_factory)
    url = server.url()
    await migrate_database(url)
    await create_effects_table(url)
    topic = await make_topic("payments", partitions=24)
    await make_topic(name=f"{topic}.dlq")
    events = [Payment(topic=topic, entity=f"e{i % 96}", seq=i) for i in range(6000)]
    await produce(kafka_bootstrap, events)
    port = free_port()
    env = inbox_env(url, kafka_bootstrap, topic, OUTBOXKIT_HTTP_PORT=str(port))
    worker = InboxProcess(tmp_path, env).start()
    try:
        async with InboxTables(url) as tables:
            await wait_for(
                lambda: _at_least(tables, 300), within=60, interval=0.1, what="effects flowing"
            )
            await asyncio.to_thread(server.stop, "immediate")
            down = time.monotonic()
            await wait_for(
                lambda: _status(port, 503), within=DOWN, interval=0.1, what="/healthz 503"
            )
            noticed = time.monotonic() - down
            await asyncio.sleep(max(0.0, DOWN - (time.monotonic() - down)))  # the outage
            await asyncio.to_thread(server.start)
            answered = time.time()
            await wait_for(
                lambda: _effect_after(tables, answered),
                within=30,
                interval=0.05,
                what="an effect after the database answered",
            )
            again = min(
                t for ts in (await tables.effect_times()).values() for t in ts if t > answered
            )
            await wait_for(lambda: _status(port, 200), within=10, interval=0.1, what="/healthz 200")
            healthy = time.time() - answered
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 24, within=90, what="all")
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    print(
        f"/healthz 503 {noticed:.1f} s after the crash; effects again {again - answered:.2f} s "
        f"and /healthz 200 {healthy:.2f} s after the database answered"
    )
    assert again - answered <= AGAIN_WITHIN, worker.log()
    async with InboxTables(url) as tables:
        found = sorted(seq for _, _, seq in await tables.effects())
    assert found == list(range(len(events))), "an effect lost or taken twice (G6)"


async def _at_least(tables: InboxTables, count: int) -> bool:
    return await tables.effect_count() >= count


async def _effect_after(tables: InboxTables, moment: float) -> bool:
    try:
        times = await tables.effect_times()
    except psycopg.OperationalError:  # the server is still starting
        return False
    return any(t > moment for ts in times.values() for t in ts)


async def _status(port: int, status: int) -> bool:
    try:
        async with http_client() as http:
            response = await http.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return response.status_code == status
    except (httpx.HTTPError, OSError):
        return False
