"""A rolling upgrade across a change of the relays' assignor protocol (docs/upgrading.md,
"Relays"): Kafka refuses a relay's join while the group's members speak another protocol. The
relay must wait, refused, and take its partitions once they have left — not exit, as it did
when the refusal came in its first join (``InconsistentGroupProtocolError`` out of the
consumer's start: an orchestrator's crash-loop back-off would then outlast the old relays)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from outboxkit.embedded._process import free_port
from tests.helpers import http_client, wait_for
from tests.integration.relay_harness import RelayProcess, register_topic, relay_env


async def test_a_relay_refused_by_another_protocol_waits_then_takes_over(
    pg_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., Awaitable[str]],
    tmp_path: Path,
) -> None:
    topic = await make_topic("protocol", partitions=2)
    env = relay_env(pg_url, kafka_bootstrap, topic)
    group = f"outboxkit.relay.{env['OUTBOXKIT_RELAY_NAME']}"
    # A member of an earlier relay: round robin, the protocol before outboxkit-blocks-v1.
    old = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        partition_assignment_strategy=(RoundRobinPartitionAssignor,),
    )
    await old.start()
    await register_topic(pg_url, topic, 2)
    port = free_port()
    relay = RelayProcess(tmp_path, {**env, "OUTBOXKIT_HTTP_PORT": str(port)}).start()
    try:
        await wait_for(
            lambda: "Kafka refused this relay's join" in relay.log(),
            within=60,
            interval=0.2,
            what="the relay to say it was refused",
        )
        assert relay.process is not None
        assert relay.process.poll() is None, relay.log()

        async def owned() -> list[str]:
            async with http_client() as http:
                response = await http.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                return list(response.json()["owned"])

        assert await owned() == []
        await old.stop()  # LeaveGroup
        left = time.monotonic()

        async def took_over() -> bool:
            return len(await owned()) == 2

        await wait_for(took_over, within=30, interval=0.1, what="the relay to take over")
        print(f"\nowned 2 partitions {time.monotonic() - left:.2f} s after the old member left")
    finally:
        relay.kill()
        await old.stop()
