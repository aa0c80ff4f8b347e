"""MongoDB replica-set faults, each a scenario a :class:`~tests.failover.harness.FailoverRun`
runs on a three-member :class:`~outboxkit.embedded.mongodb.EmbeddedMongoReplicaSet` (priorities
3, 2, 1): the test and ``bench/failover.py`` run the same ones.

Every scenario takes the primary away, waits until the pipeline has caught up *without* it
(the gap an operator sees: an election, the writers' retried transactions, the relays' change
streams and inbox transactions on the new primary), brings it back, and waits until every
member serves, member 0 (the highest priority) is primary again if it takes it back within
:data:`TAKEOVER_WAIT`, and the pipeline has caught up once more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from outboxkit.embedded._process import ServerStartError
from outboxkit.embedded.mongodb import EmbeddedMongoReplicaSet
from tests.failover.harness import FailoverRun

#: A scenario: one or more faults in ``run`` (each inside ``run.fault``).
Scenario = Callable[[FailoverRun, EmbeddedMongoReplicaSet], Awaitable[None]]


#: How long a scenario waits, after the fault, for member 0 (the highest priority) to take the
#: primary back. With the tests' 500 ms heartbeats it does within seconds; with mongod's
#: defaults under a steady write load its takeover elections kept losing ("candidate's data is
#: staler than mine": the others had applied newer writes) for over 90 s, so it is not required.
TAKEOVER_WAIT = 30.0

#: How long a scenario waits for every member to serve again. A member that rejoins after a
#: SIGTERM may roll back what it wrote alone (its 1 s quiesce), replaying the oplog from its
#: last stable checkpoint; on a starved 2-core machine one such replay ran past 120 s (its
#: stable timestamp 48 s behind), failing a full run where the others took seconds.
MEMBERS_BACK = 180.0


async def _members_back(run: FailoverRun, replica_set: EmbeddedMongoReplicaSet) -> str:
    """Wait until every member serves again and, up to :data:`TAKEOVER_WAIT`, member 0 is
    primary (its priority takeover: one more election, as in production), then until the
    pipeline caught up; says what happened."""
    started = time.time()
    await asyncio.to_thread(replica_set.wait_for_members, timeout=MEMBERS_BACK)
    first = replica_set.members[0]
    try:
        await asyncio.to_thread(replica_set.wait_for_primary, first, timeout=TAKEOVER_WAIT)
        back = f"member 0 primary again after {time.time() - started:.1f} s"
    except ServerStartError:
        back = f"member 0 not primary again within {TAKEOVER_WAIT:.0f} s"
    await run.settled()
    return f"{back}, caught up after {time.time() - started:.1f} s"


async def step_down(run: FailoverRun, replica_set: EmbeddedMongoReplicaSet) -> None:
    """``replSetStepDown`` of the primary while writers commit and relays read and publish, at
    a quiet load: the change streams must reopen on the new primary and wake the relays on
    commit again (a relay woken only by its sweep would show in the quiet window after)."""
    async with run.fault("primary step-down", load="quiet") as fault:
        old, new = await asyncio.to_thread(replica_set.step_down, 5, catch_up_seconds=2)
        await run.settled()
        without = time.time() - fault.started
        back = await _members_back(run, replica_set)
        fault.detail = (
            f"replSetStepDown member {old.index} → member {new.index}; caught up after "
            f"{without:.1f} s; {back}"
        )


async def kill_primary(run: FailoverRun, replica_set: EmbeddedMongoReplicaSet) -> None:
    """SIGKILL of the primary; it restarts on its data, rejoins and takes the primary back."""
    async with run.fault("primary SIGKILL") as fault:
        victim = await asyncio.to_thread(replica_set.primary)
        await asyncio.to_thread(victim.kill)
        killed = time.time()
        elected = await asyncio.to_thread(replica_set.primary, timeout=90)
        election = time.time() - killed
        await run.settled()
        without = time.time() - fault.started
        await asyncio.to_thread(victim.start)
        back = await _members_back(run, replica_set)
        fault.detail = (
            f"SIGKILL member {victim.index}; member {elected.index} elected after "
            f"{election:.1f} s; caught up after {without:.1f} s; restarted: {back}"
        )


async def rolling_restart(run: FailoverRun, replica_set: EmbeddedMongoReplicaSet) -> None:
    """Every member stopped (SIGTERM) and started in turn, the primary last after stepping
    down, as an upgrade does."""
    async with run.fault("rolling restart") as fault:
        order = await asyncio.to_thread(replica_set.rolling_restart)
        restarted = time.time() - fault.started
        back = await _members_back(run, replica_set)
        fault.detail = (
            f"SIGTERM and restart of members {', '.join(str(m.index) for m in order)} "
            f"in {restarted:.1f} s; {back}"
        )


#: Scenario name → scenario. ``bench/failover.py`` runs them by these names (``--only``).
MONGODB_FAULTS: dict[str, Scenario] = {
    "mongo-stepdown": step_down,
    "mongo-kill-primary": kill_primary,
    "mongo-rolling": rolling_restart,
}
