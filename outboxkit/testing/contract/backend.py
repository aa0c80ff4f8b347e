"""What the contract suites need of a backend: the smallest surface a new database (or your own
store) implements to run them.

A fixture gives the suite one object per test, on a fresh, empty, migrated database of the
backend: :class:`RelayBackend` for the relay's storage contract and per-key order,
:class:`InboxBackend` for the inbox store's. Both are plain protocols; the repository's own
memory, PostgreSQL and MongoDB cases implement them in ``tests/integration/backends.py``.

What a backend cannot do is declared in ``supports`` (:data:`Feature`): a test that needs it is
skipped and says so, never left to chance.
"""

from __future__ import annotations

from collections.abc import Awaitable, Collection
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any, Literal, Protocol

import pytest

from outboxkit.backends import Transactions
from outboxkit.inbox import InboxStore
from outboxkit.relay import OutboxOperations, OutboxStorage, WakeupSource

#: What a backend may declare it does, beyond what every backend must:
#:
#: ``outside_transaction``  its writer refuses a handle that is in no transaction
#:                          (:class:`~outboxkit.relay.NotInTransactionError`); the backend then
#:                          implements :meth:`RelayBackend.outside_transaction`.
#: ``same_key_commit_order``  a second writer of a key waits for (or retries after) an open
#:                          transaction that wrote it, and comes after it (G2 for concurrent
#:                          writers of one key).
#: ``presence``             its storage tells a relay that another relay's database session
#:                          ended (``announce_member``, ``departed_members``,
#:                          ``forget_members``); a storage whose ``departed_members`` always
#:                          answers ``None`` ("cannot tell") declares nothing.
Feature = Literal["outside_transaction", "same_key_commit_order", "presence"]


class RelayBackend(Protocol):
    """One fresh, empty database of a backend, as the relay's storage contract uses it."""

    #: Names the backend in failure messages and skips.
    name: str

    @property
    def supports(self) -> Collection[str]:
        """The features it declares (:data:`Feature`)."""

    def relay(
        self, *, retention: timedelta | None = None
    ) -> AbstractAsyncContextManager[tuple[OutboxStorage, WakeupSource]]:
        """The relay's storage and wake-up source on this database, open. ``retention``: keep
        published records this long (``keep=True``) rather than the backend's default; a
        storage that stamps the expiry when it settles a record needs it."""

    def operations(self) -> AbstractAsyncContextManager[OutboxOperations]:
        """The operator's repairs (list, retry, skip, replay) on this database, open."""

    def transactions(self, *, pool_size: int) -> AbstractAsyncContextManager[Transactions]:
        """The service's side: its transactions and the outbox writer that goes with them, with
        ``pool_size`` transactions open at once at least."""

    def outside_transaction(self, tx: Transactions) -> AbstractAsyncContextManager[Any]:
        """A handle of the writer's transaction type that is in no transaction (a connection in
        autocommit, a session without a transaction). Only for ``outside_transaction``."""


class InboxBackend(Protocol):
    """One fresh, empty database of a backend, as the inbox store's contract uses it."""

    name: str

    def inbox_store(self, *, retention: timedelta) -> AbstractAsyncContextManager[InboxStore[Any]]:
        """An inbox store on this database, open; ``retention``: how long a dedupe record
        counts. The suite opens two at once to play two workers."""

    def write_effect(self, tx: Any, value: str) -> Awaitable[None]:
        """What a handler writes in the transaction ``tx`` its store gave it."""

    def read_effects(self) -> Awaitable[list[str]]:
        """Every value :meth:`write_effect` wrote that committed, in commit order."""


def require(backend: RelayBackend, feature: Feature) -> None:
    """Skip the running test unless ``backend`` declares ``feature``."""
    if feature not in backend.supports:
        pytest.skip(f"{backend.name}: declared not to support {feature}")
