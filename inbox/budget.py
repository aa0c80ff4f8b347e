"""How long one inbox transaction may run (G8): the database's own limit, and the share of it
that a batch's handlers may use before the batch stops growing.

A database aborts a transaction that outlives its limit (MongoDB's
``transactionLifetimeLimitSeconds``, 60 s by default; PostgreSQL's ``transaction_timeout``, off
by default). A batch of 500 records whose handlers take 120 ms each needs 60 s: it would be
aborted every time, and retried forever. So a store commits what its handlers did once they have
used :data:`BUDGET_FRACTION` of the limit (the rest of the batch goes in the next transaction),
and a batch aborted anyway — one handler alone ran long — is split by the worker, down to the one
record that does not fit, whose handler then counts as failing (attempts, then dead letter).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

#: Share of the database's limit a batch's handlers may use before the store commits what they
#: did: the handler running when it passes still has three quarters of the limit to finish in.
BUDGET_FRACTION = 0.25

#: Seconds a store trusts the limit it read (an operator may change it on a running server).
LIMIT_REFRESH = 60.0


@dataclass(frozen=True, slots=True)
class TransactionLimit:
    """``lifetime``: seconds after which the database aborts a transaction (None: never);
    ``idle``: seconds of silence within a transaction after which it does (PostgreSQL's
    ``idle_in_transaction_session_timeout``; it does not grow with the batch, so it sets no
    budget). ``name`` says which setting, for the messages."""

    lifetime: float | None = None
    idle: float | None = None
    name: str = "the database's transaction time limit"

    def deadline(self, started: float) -> float:
        """The monotonic time after which a batch started at ``started`` stops growing."""
        if self.lifetime is None:
            return math.inf
        return started + BUDGET_FRACTION * self.lifetime

    def outlived(self, elapsed: float) -> bool:
        """Whether a transaction that failed after ``elapsed`` seconds may have been aborted by
        the limit (rather than by an outage)."""
        shortest = min((s for s in (self.lifetime, self.idle) if s is not None), default=None)
        return shortest is not None and elapsed >= shortest

    def message(self, elapsed: float) -> str:
        return (
            f"the transaction ran {elapsed:.1f} s and the database aborted it: it outlived "
            f"{self.name}; a record whose handler alone takes that long cannot be handled"
        )


class CachedLimit:
    """The limit as ``read`` returns it, read again at most every :data:`LIMIT_REFRESH` s."""

    def __init__(self, read: Callable[[], Awaitable[TransactionLimit]]) -> None:
        self._read = read
        self._limit: TransactionLimit | None = None
        self._read_at = 0.0

    async def get(self) -> TransactionLimit:
        now = time.monotonic()
        if self._limit is None or now - self._read_at >= LIMIT_REFRESH:
            self._limit = await self._read()
            self._read_at = now
        return self._limit
