"""A worker started during an outage waits for it (OUTBOXKIT_STARTUP_GRACE) instead of exiting
into an orchestrator's crash-loop back-off (issue #30): it warns while it waits, starts when the
server is back, and exits with the usual one line if the grace runs out."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from outboxkit.embedded import free_port
from outboxkit.embedded.postgres import EmbeddedPostgres
from tests.helpers import run_cli, wait_for
from tests.integration.conftest import MakeTopic, migrate_database
from tests.integration.relay_harness import (
    Writers,
    check_guarantees,
    read_topic,
    register_topic,
    relay_env,
    relays,
    wait_pending,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_a_relay_started_while_its_database_is_down_starts_when_it_is_back(
    pg_factory: Callable[[], EmbeddedPostgres],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    pg = pg_factory()
    url = pg.url()
    await migrate_database(url)
    topic = await make_topic("grace", partitions=2)
    await register_topic(url, topic, 2)
    pg.stop()
    env = relay_env(url, kafka_bootstrap, topic, OUTBOXKIT_STARTUP_GRACE="60")
    with relays(tmp_path, env) as [relay]:
        await wait_for(
            lambda: "waiting for what this worker needs" in relay.log(),
            within=30,
            what="the relay to wait for its database",
        )
        pg.start()
        await wait_for(
            lambda: "partitions assigned" in relay.log(), within=60, what="the relay to start"
        )
        writers = Writers(url, topic, entities=4)
        writers.start()
        await wait_for(lambda: writers.total >= 100, within=30, what="100 events written")
        await writers.stop()

        await wait_pending(url, within=60)
        assert relay.process is not None
        assert relay.process.poll() is None
        assert "Traceback" not in relay.log()
    check_guarantees(writers, await read_topic(kafka_bootstrap, topic, 2))


def test_a_worker_gives_up_when_the_grace_runs_out(pg_url: str) -> None:
    closed = f"127.0.0.1:{free_port()}"
    env = {
        "OUTBOXKIT_DATABASE_URL": pg_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": closed,
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_STARTUP_GRACE": "3",
    }
    started = time.monotonic()
    result = run_cli("relay", env=env)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert took >= 3, f"gave up after {took:.1f} s, before its grace"
    assert "waiting for what this worker needs" in result.stderr + result.stdout
    assert f"error: cannot reach Kafka at {closed}" in result.stderr
    assert "Traceback" not in result.stderr


def test_what_waiting_cannot_fix_stops_a_worker_at_once(pg_url: str, kafka_bootstrap: str) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": pg_url.replace("postgres@", "nobody@"),
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_STARTUP_GRACE": "60",
    }
    started = time.monotonic()
    result = run_cli("relay", env=env)
    assert result.returncode == 1, result.stderr
    assert "refused the login" in result.stderr
    assert time.monotonic() - started < 30, "a refused login is not waited for"
