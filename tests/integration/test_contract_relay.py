"""The relay's storage contract on every backend of the repository — in memory, PostgreSQL and
MongoDB — through the suite outboxkit ships (outboxkit/testing/contract/relay.py), exactly as a
third backend runs it (docs/testing.md, "Proving your own backend")."""

from __future__ import annotations

import pytest

from outboxkit.testing.contract import RelayBackend, RelayStorageContract
from tests.integration.backends import BackendCase


class TestRelayStorage(RelayStorageContract):
    @pytest.fixture
    def relay_backend(self, backend_case: BackendCase) -> RelayBackend:
        return backend_case
