"""The inbox store's contract on every backend of the repository — in memory, PostgreSQL and
MongoDB — through the suite outboxkit ships (outboxkit/testing/contract/inbox.py)."""

from __future__ import annotations

import pytest

from outboxkit.testing.contract import InboxBackend, InboxStoreContract
from tests.integration.backends import BackendCase


class TestInboxStore(InboxStoreContract):
    @pytest.fixture
    def inbox_backend(self, backend_case: BackendCase) -> InboxBackend:
        return backend_case
