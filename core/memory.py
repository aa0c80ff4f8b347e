"""The in-memory "database" transaction, shared by the in-memory outbox writer and inbox store
(tests and the ``memory://`` backend only: one process, nothing survives it).

A :class:`MemoryTransaction` holds what a block of work did; nothing of it is visible until
:meth:`~MemoryTransaction.commit`, and a transaction that is dropped (an exception) leaves no
trace — the same all-or-nothing a database transaction gives, so engine and handler tests
can check "effects exactly once" without a server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class MemoryTransaction:
    """Handlers record their effects with :meth:`record`; writers register what to apply on
    commit with :meth:`on_commit`."""

    effects: list[object] = field(default_factory=list)
    _on_commit: list[Callable[[], None]] = field(default_factory=list)
    committed: bool = False

    def record(self, effect: object) -> None:
        self.effects.append(effect)

    def on_commit(self, apply: Callable[[], None]) -> None:
        self._on_commit.append(apply)

    def commit(self) -> list[object]:
        """Apply what was registered, in order; return the recorded effects."""
        if self.committed:
            raise RuntimeError("this memory transaction committed already")
        self.committed = True
        for apply in self._on_commit:
            apply()
        return self.effects
