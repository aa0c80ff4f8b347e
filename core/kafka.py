"""Kafka helpers shared by the commands and workers: partition counts, leaving a group."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

import structlog
from aiokafka.admin import AIOKafkaAdminClient

from outboxkit.core.exceptions import ConfigurationError

logger = structlog.get_logger("outboxkit")


async def partition_counts(
    bootstrap_servers: Sequence[str], topics: Sequence[str]
) -> dict[str, int]:
    """Each topic's partition count; :class:`ConfigurationError` names the missing topics."""
    admin = AIOKafkaAdminClient(bootstrap_servers=list(bootstrap_servers), client_id="outboxkit")
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    counts = {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
    missing = sorted(set(topics) - {t for t, n in counts.items() if n})
    if missing:
        raise missing_topics(missing)
    return {t: counts[t] for t in topics}


def missing_topics(topics: Sequence[str]) -> ConfigurationError:
    """The error for topics that Kafka does not have."""
    return ConfigurationError(
        f"topic(s) {', '.join(topics)} do not exist on Kafka: create them (outboxkit never "
        "creates topics) or fix OUTBOXKIT_TOPICS"
    )


async def leave_group(stop: Awaitable[None], *, within: float, who: str) -> None:
    """Await a group member's ``stop()`` (which leaves the group), at most ``within`` seconds.

    A stop that hangs — a coordinator that does not answer, a rebalance that does not end —
    must not keep a worker from exiting: Kafka drops a member that stopped heartbeating after
    its session timeout anyway, and no guarantee rests on a clean leave (a relay's next owner
    fences it; an inbox's next owner absorbs what it handles again)."""
    try:
        async with asyncio.timeout(within):
            await stop
    except Exception as exc:  # TimeoutError too
        logger.warning(
            "could not leave the consumer group cleanly; Kafka drops this member after its "
            "session timeout",
            member=who,
            error=repr(exc),
        )
