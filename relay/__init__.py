"""The relay: publishes committed outbox records to Kafka."""

from outboxkit.relay.exceptions import RelayError

__all__ = ["RelayError"]
