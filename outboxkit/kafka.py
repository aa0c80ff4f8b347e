"""Kafka metadata shared by the commands: how many partitions each topic has."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient

from outboxkit.exceptions import ConfigurationError


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
