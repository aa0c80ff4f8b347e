"""The example services' own tests use outboxkit's pytest plugin, as your service's would:
real PostgreSQL and Kafka (embedded, or OUTBOXKIT_TEST_PG_URL / OUTBOXKIT_TEST_KAFKA), or
everything in memory. Run them with ``pytest examples/orders_payments``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

pytest_plugins = ["outboxkit.testing"]

HERE = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def outboxkit_schema() -> Sequence[Path]:
    """Both services' tables, in each test's database (next to outboxkit's)."""
    return [HERE / "orders.sql", HERE / "payments.sql"]
