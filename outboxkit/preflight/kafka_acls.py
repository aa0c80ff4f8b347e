"""The Kafka ACLs each worker needs, and no more (docs/security.md; ``outboxkit acls``).

Kafka lets READ and WRITE imply DESCRIBE, and WRITE on any topic imply IDEMPOTENT_WRITE on the
cluster (KIP-679, Kafka 3.0 and later), so neither is listed. Tests run the relay and the inbox
against a broker that enforces ACLs, with exactly these granted, and with each one taken away
(tests/integration/test_secured_kafka.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ResourceType = Literal["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]
Operation = Literal["READ", "WRITE", "DESCRIBE", "CREATE", "IDEMPOTENT_WRITE", "DESCRIBE_CONFIGS"]
Pattern = Literal["LITERAL", "PREFIXED"]

#: The name Kafka gives the cluster resource.
CLUSTER = "kafka-cluster"


@dataclass(frozen=True)
class Acl:
    """Allow ``operations`` on one resource (``name`` is a prefix when ``pattern`` is
    PREFIXED), for the reason ``why``."""

    resource_type: ResourceType
    name: str
    operations: tuple[Operation, ...]
    why: str
    pattern: Pattern = "LITERAL"

    def kafka_acls_command(self, principal: str, bootstrap: str = "$BOOTSTRAP") -> str:
        """The ``kafka-acls.sh`` command that grants it to ``principal``."""
        resource = {
            "TOPIC": f"--topic {self.name}",
            "GROUP": f"--group {self.name}",
            "CLUSTER": "--cluster",
            "TRANSACTIONAL_ID": f"--transactional-id {self.name}",
        }[self.resource_type]
        pattern = " --resource-pattern-type prefixed" if self.pattern == "PREFIXED" else ""
        operations = " ".join(f"--operation {_cli(op)}" for op in self.operations)
        return (
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties "
            f"--add --allow-principal {principal} {operations} {resource}{pattern}"
        )


def relay_acls(group_id: str, topics: Sequence[str], *, transactional: bool = True) -> list[Acl]:
    """What ``outboxkit relay`` of consumer group ``group_id`` needs to publish ``topics``."""
    acls = [
        Acl(
            "TOPIC",
            topic,
            ("WRITE", "READ"),
            "publish; READ because the relay confirms its membership of the group with an "
            "offset commit on its topics (it reads no record)",
        )
        for topic in topics
    ]
    acls.append(
        Acl(
            "GROUP",
            group_id,
            ("READ",),
            "join the relays' consumer group: its assignment is the right to publish; also "
            "lets a relay describe the group and remove a dead relay's member at once",
        )
    )
    if transactional:
        acls.append(
            Acl(
                "TRANSACTIONAL_ID",
                f"{group_id}.",
                ("WRITE",),
                "one transactional id per block of partitions: fences a stale owner",
                "PREFIXED",
            )
        )
    return acls


def inbox_acls(group_id: str, topics: Sequence[str], dlq_suffix: str = ".dlq") -> list[Acl]:
    """What ``outboxkit inbox`` of consumer group ``group_id`` needs to consume ``topics``."""
    acls = [Acl("TOPIC", t, ("READ",), "consume") for t in topics]
    acls += [
        Acl("TOPIC", f"{t}{dlq_suffix}", ("WRITE",), "dead-letter what cannot be handled")
        for t in topics
        if not t.endswith(dlq_suffix)
    ]
    acls.append(Acl("GROUP", group_id, ("READ",), "consume as a group and commit offsets"))
    return acls


def _cli(operation: Operation) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))
