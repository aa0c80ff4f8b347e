"""An inbox fed by the relay reads a topic written in Kafka transactions: every transaction
ends with a commit marker, which takes an offset but is never returned to a ``read_committed``
consumer. An inbox that has handled everything must still commit past the last marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outboxkit.embedded._process import free_port
from tests.helpers import http_client, wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    group_of,
    inbox_env,
    wait_caught_up,
    wait_effects,
)
from tests.integration.relay_harness import Writers, register_topic, relay_env, relays


async def _health(port: int) -> tuple[int, dict[str, Any]]:
    async with http_client() as http:
        response = await http.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        return response.status_code, response.json()


async def test_idle_inbox_after_relay_transactions_has_no_lag_and_is_not_stalled(
    migrated_postgresql_url: str, make_topic: MakeTopic, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Would catch the inbox committing the offset after its last record, one short of the
    end: a lag of 1 per partition for ever, and once ``OUTBOXKIT_STALL_AFTER`` passed with
    nothing new, its partitions reported stalled and ``/healthz`` 503 (seen before the fix)."""
    url = migrated_postgresql_url
    topic = await make_topic("markers", partitions=2)
    await make_topic(name=f"{topic}.dlq")
    await create_effects_table(url)
    await register_topic(url, topic, 2)
    port = free_port()
    env = inbox_env(
        url, kafka_bootstrap, topic, OUTBOXKIT_STALL_AFTER="2", OUTBOXKIT_HTTP_PORT=str(port)
    )
    inbox = InboxProcess(tmp_path, env).start()
    writers = Writers(url, topic, entities=4, kind=Payment)
    try:
        with relays(tmp_path, relay_env(url, kafka_bootstrap, topic)):
            writers.start(writers=1, pause=0.02)
            await wait_for(lambda: writers.total >= 20, within=30, what="20 events written")
            await writers.stop()

            await wait_effects(
                url, lambda found: len(found) >= writers.total, within=60, what="every effect"
            )
            await wait_caught_up(
                kafka_bootstrap,
                group_of(topic),
                topic,
                2,
                within=30,
                what="the inbox's committed offsets to reach the end of the topic",
                interval=0.5,
            )

            async def idle_past_stall_after() -> bool:
                return (await _health(port))[1]["seconds_since_progress"] > 3

            await wait_for(idle_past_stall_after, within=30, interval=0.5, what="3 s idle")
            status, health = await _health(port)
        assert status == 200, health
        assert set(health["lag"].values()) == {0}, health
        assert health["partitions"] == [], health
    finally:
        inbox.kill()
