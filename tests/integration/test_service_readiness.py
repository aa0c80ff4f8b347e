"""A service is not ready while a write would fail (#44): ``Outboxkit(writes=…)`` keeps
``/healthz`` at 503 until the written topics are registered (tests/unit/test_service.py drives
it in memory); here, each backend tells which topics are registered, as its writer sees them."""

from __future__ import annotations

from tests.integration.backends import BackendCase


async def test_registered_topics_are_the_ones_a_write_may_use(backend_case: BackendCase) -> None:
    async with backend_case.transactions(pool_size=1) as transactions:
        assert await transactions.registered_topics(["orders", "payments"]) == set()
        async with backend_case.backend.outbox_storage(backend_case.settings) as storage:
            await storage.register_topics({"orders": 2})  # as `outboxkit topics sync` does
        assert await transactions.registered_topics(["orders", "payments"]) == {"orders"}
