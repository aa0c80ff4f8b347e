"""The unit tier needs no server and reads nothing from the caller's environment: a shell that
ran ``eval "$(outboxkit dev up)"`` exports ``OUTBOXKIT_DATABASE_URL`` and friends, and a unit
test that builds settings would read them (#44). Every ``OUTBOXKIT_*`` variable is removed for
each unit test; a test that wants one sets it with ``monkeypatch.setenv``."""

from __future__ import annotations

import os

import pytest

#: Knobs of the repository's own tests (read at import): they tune a test, not outboxkit.
KEPT = frozenset({"OUTBOXKIT_FUZZ_EXAMPLES"})


@pytest.fixture(autouse=True)
def _no_outboxkit_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_") and name not in KEPT:
            monkeypatch.delenv(name)
