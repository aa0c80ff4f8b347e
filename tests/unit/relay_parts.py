"""What the unit tests of a block worker's parts share (test_relay_gate.py, test_relay_lease.py,
test_relay_clock.py, test_relay_settler.py): settings, metrics on their own registry, and the
two partitions of topic ``t`` the parts look after."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from outboxkit.relay.blocks import Block
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.settings import RelaySettings
from tests.unit.relay_engine_harness import TOPIC, tp

#: Partitions 0 and 1 of topic ``t``: one block of two.
BLOCK = Block(TOPIC, 0, 1)
TPS = [tp(0), tp(1)]


def settings(**overrides: Any) -> RelaySettings:
    values: dict[str, Any] = {"database_url": "postgresql://x/y", "topics": TOPIC}
    return RelaySettings(**{**values, **overrides})


class Metrics:
    """:class:`RelayMetrics` on a registry of their own, and a way to read them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.relay = RelayMetrics(self.registry)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def stage_count(self, stage: str) -> float:
        """How many times ``stage`` was observed."""
        return self.value("outboxkit_relay_stage_seconds_count", stage=stage)
