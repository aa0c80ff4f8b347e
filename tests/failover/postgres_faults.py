"""PostgreSQL faults, each a scenario a :class:`~tests.failover.harness.FailoverRun` runs on a
:class:`~outboxkit.embedded.postgres.ReplicatedPostgres` (a primary and a synchronous streaming
standby; every worker and writer on its multi-host URL, ``target_session_attrs=read-write``):
the test and ``bench/failover.py`` run the same ones.

Each marks its heal (``fault.healed``) when the database answers writes again: the server
restarted, or the standby promoted. The harness then requires the delays back to the window
before the fault (:mod:`tests.failover.baseline`). A scenario that promoted the standby makes
the former primary a standby again afterwards, from a fresh copy (``pg_basebackup``), as an
operator does before the next failover can be survived.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from outboxkit.embedded.postgres import ReplicatedPostgres
from tests.failover.harness import FailoverRun, Worker
from tests.failover.report import Load
from tests.network.workers import metric

#: A scenario: one fault in ``run`` (inside ``run.fault``).
Scenario = Callable[[FailoverRun, ReplicatedPostgres], Awaitable[None]]

#: Seconds between the primary's death and the standby's promotion: what a failover manager
#: takes to decide (Patroni's loop is 10 s by default; this is the test's).
DECIDE = 2.0

#: The bound within which a window after the heal must be as fast as before: the writers' and
#: workers' reconnection, a sweep, a window. Wake-ups lost with the declarations would keep a
#: quiet window at a sweep interval for good.
BACK_WITHIN = 8.0

#: What an operator sees of the relays' wake-ups, per fault: the counters' increase.
_SIGNALS = {
    "declarations lost": "outboxkit_relay_declarations_lost_total",
    "listener reconnects": 'outboxkit_relay_wakeups_total{reason="reconnect"}',
    "unannounced sweeps": "outboxkit_relay_unannounced_sweeps_total",
}


async def crash_restart(run: FailoverRun, pair: ReplicatedPostgres) -> None:
    """The primary crashes (SIGQUIT: no shutdown checkpoint, WAL recovery at the start) and
    starts again on its data; the standby stays its standby. Crash recovery empties every
    unlogged table, the relays' idle declarations with them."""
    await _fault(run, "primary crash restart", "quiet", _crash_restart(pair))


async def switchover(run: FailoverRun, pair: ReplicatedPostgres) -> None:
    """A planned switchover: the primary shut down cleanly (its last WAL streamed to the
    standby), the standby promoted; then the former primary rejoins as the new standby, on its
    own data."""
    await _standby(pair)
    await _fault(run, "switchover", "busy", _switchover(pair))
    began = time.monotonic()
    await asyncio.to_thread(pair.rejoin)
    run.faults[-1].detail += f"; rejoined as the standby in {time.monotonic() - began:.1f} s"


async def kill_and_promote(run: FailoverRun, pair: ReplicatedPostgres) -> None:
    """The primary SIGKILLed; :data:`DECIDE` seconds later the standby promoted. (The former
    primary may hold WAL the standby never had: it could rejoin only from a fresh copy,
    :meth:`~outboxkit.embedded.postgres.ReplicatedPostgres.attach_standby`.)"""
    await _standby(pair)
    await _fault(run, "primary SIGKILL, standby promoted", "quiet", _kill_and_promote(pair))


async def _standby(pair: ReplicatedPostgres) -> None:
    """A standby to promote: a fresh copy if the last promotion left none."""
    if not pair.standby.running:
        await asyncio.to_thread(pair.attach_standby)


async def _crash_restart(pair: ReplicatedPostgres) -> str:
    primary = pair.primary
    await asyncio.to_thread(primary.stop, "immediate")
    began = time.monotonic()
    await asyncio.to_thread(primary.start)
    return f"SIGQUIT port {primary.port}, accepting again after {time.monotonic() - began:.1f} s"


async def _switchover(pair: ReplicatedPostgres) -> str:
    old = pair.primary
    began = time.monotonic()
    await asyncio.to_thread(old.stop, "fast")
    stopped = time.monotonic() - began
    await asyncio.to_thread(pair.promote)
    return (
        f"port {old.port} stopped in {stopped:.1f} s, port {pair.primary.port} promoted "
        f"{time.monotonic() - began:.1f} s after the stop began"
    )


async def _kill_and_promote(pair: ReplicatedPostgres) -> str:
    old = pair.primary
    await asyncio.to_thread(old.kill)
    await asyncio.sleep(DECIDE)
    began = time.monotonic()
    await asyncio.to_thread(pair.promote)
    return (
        f"SIGKILL port {old.port}; port {pair.primary.port} promoted {DECIDE:g} s later, "
        f"in {time.monotonic() - began:.1f} s"
    )


async def _fault(run: FailoverRun, name: str, load: Load, inject: Awaitable[str]) -> None:
    relays = [w for w in run.workers if w.name.startswith("relay")]
    before = await _signals(relays)
    async with run.fault(name, load=load, back_within=BACK_WITHIN) as fault:
        fault.detail = await inject
        fault.healed = time.time()
    fault.seen = _describe(before, await _signals(relays))


async def _signals(relays: list[Worker]) -> dict[str, float]:
    return {
        name: sum([await metric(relay, series) for relay in relays])
        for name, series in _SIGNALS.items()
    }


def _describe(before: dict[str, float], after: dict[str, float]) -> str:
    return ", ".join(f"{name} +{after[name] - before[name]:g}" for name in _SIGNALS)


#: Scenario name → scenario. ``bench/failover.py`` runs them by these names (``--only``).
POSTGRES_FAULTS: dict[str, Scenario] = {
    "pg-crash-restart": crash_restart,
    "pg-switchover": switchover,
    "pg-kill-promote": kill_and_promote,
}
