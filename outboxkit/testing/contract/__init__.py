"""The contract suites every backend of outboxkit passes, shipped so that yours can too.

outboxkit runs its in-memory, PostgreSQL and MongoDB backends through these very classes
(``tests/integration/test_contract_*.py``), as SQLAlchemy ships its dialect compliance suite. To
prove a store of your own, subclass them in a test module and give them a fixture that opens one
fresh, empty database of your backend per test (docs/testing.md, "Proving your own backend")::

    from outboxkit.testing.contract import (
        InboxStoreContract,
        RelayOrderContract,
        RelayStorageContract,
    )

    class TestMyRelayStorage(RelayStorageContract): ...
    class TestMyRelayOrder(RelayOrderContract): ...
    class TestMyInboxStore(InboxStoreContract): ...

- :class:`RelayStorageContract` (fixture ``relay_backend``): ``settle_and_claim`` (heads, depth,
  settling, the bound in bytes), failed records, retention, replay, backlog, the writer's
  checks, wake-ups (G3, G5, G8);
- :class:`RelayOrderContract` (fixture ``relay_backend``): each key published in its commit
  order through any interleaving of writers and relay steps (G2; a hypothesis property);
- :class:`InboxStoreContract` (fixture ``inbox_backend``): effects once, a failing handler
  rolled back alone, two workers at once, expiry (G6, G7).

The fixtures give a :class:`RelayBackend` or an :class:`InboxBackend`; what a backend does not
do is declared in its ``supports`` (:data:`Feature`) and the test that needs it skips, saying so.
The tests are marked ``asyncio``: they run in pytest-asyncio's strict mode and in auto mode.
"""

from __future__ import annotations

from outboxkit.testing.contract.backend import Feature, InboxBackend, RelayBackend, require
from outboxkit.testing.contract.inbox import InboxStoreContract
from outboxkit.testing.contract.relay import RelayStorageContract
from outboxkit.testing.contract.relay_order import RelayOrderContract

__all__ = [
    "Feature",
    "InboxBackend",
    "InboxStoreContract",
    "RelayBackend",
    "RelayOrderContract",
    "RelayStorageContract",
    "require",
]
