"""What a check of ``outboxkit check`` returns, and the results every database's check shares.

The backends check their own database (``Backend.check``) and :mod:`outboxkit.preflight` runs
them with Kafka's checks; this small module is all the backends need of it, so a service that
writes, relays or consumes never loads the operator's preflight tooling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outboxkit.migrations import Migration

__all__ = [
    "CLOCK_SKEW_WARN",
    "DEV_HINT",
    "CheckResult",
    "clock_result",
    "first_line",
    "migrations_result",
]


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    summary: str
    fix: str | None = None
    #: The server did not answer (it may be starting, restarting or failing over): a worker
    #: waits for it during its start-up grace. False for what waiting cannot fix (a refused
    #: login, a missing table, a certificate).
    unreachable: bool = False
    #: Kafka refused an operation to this principal (an ACL is missing): the other ACLs of a
    #: worker are still worth checking in the same run.
    denied: bool = False
    #: The topics Kafka would not describe to this principal (the worker's ACL probes name the
    #: READ or WRITE it needs on each instead).
    refused_topics: tuple[str, ...] = ()
    #: The exception behind a failed check, if one was raised (``--debug`` shows its
    #: traceback); not part of the result's JSON.
    error: BaseException | None = field(default=None, repr=False, compare=False)

    def as_json(self) -> dict[str, object]:
        """The result for ``outboxkit check --json``."""
        return {
            "name": self.name,
            "ok": self.ok,
            "summary": self.summary,
            "fix": self.fix,
            "unreachable": self.unreachable,
        }


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].strip()


DEV_HINT = 'on a laptop, `eval "$(outboxkit dev up)"` starts PostgreSQL and Kafka'


#: A clock this far from the database's (seconds) is worth fixing (NTP), though no guarantee
#: depends on it.
CLOCK_SKEW_WARN = 5.0


def clock_result(server: str, skew: float, round_trip: float) -> CheckResult:
    """``clock``: how far this host's wall clock is from the database server's (``skew``,
    the server's minus this host's, read at the middle of a ``round_trip``). Never a failure:
    what must agree between workers (dedupe expiry, stall checks, MongoDB positions) runs on
    the database's clock; a worker's own stamps only each record's Kafka timestamp."""
    side = "ahead of" if skew < 0 else "behind"
    summary = (
        f"this host's clock is {abs(skew):.3f} s {side} {server}'s "
        f"(±{round_trip / 2:.3f} s, the round trip's half)"
    )
    if abs(skew) < CLOCK_SKEW_WARN:
        return CheckResult("clock", True, summary)
    return CheckResult(
        "clock",
        True,
        summary + ": Kafka record timestamps (CreateTime) written here are off by as much",
        "Synchronise this host's clock (NTP, chrony).",
    )


def migrations_result(pending: list[Migration], where: str) -> CheckResult:
    """``migrations``: whether ``pending`` (of the database ``where``) leaves anything to do."""
    if not pending:
        return CheckResult("migrations", True, "schema is up to date")
    labels = ", ".join(m.label for m in pending)
    # Every migration pending (the first creates the schema): a newcomer's "not migrated yet".
    state = "does not exist" if pending[0].version == 1 else "is not up to date"
    return CheckResult(
        "migrations",
        False,
        f"outboxkit's schema {state} in {where} ({len(pending)} migration(s) not applied: "
        f"{labels})",
        "Run `outboxkit migrate` (on PostgreSQL you may apply `outboxkit migrate --sql` with "
        "your own migration tool).",
    )
