"""Per-key order (G2) at the storage level on every backend of the repository — in memory,
PostgreSQL and MongoDB — through the suite outboxkit ships
(outboxkit/testing/contract/relay_order.py), including its hypothesis property."""

from __future__ import annotations

import pytest

from outboxkit.testing.contract import RelayBackend, RelayOrderContract
from tests.integration.backends import BackendCase


class TestRelayOrder(RelayOrderContract):
    @pytest.fixture
    def relay_backend(self, backend_case: BackendCase) -> RelayBackend:
        return backend_case
