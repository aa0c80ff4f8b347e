"""Kafka broker faults, each a scenario a :class:`~tests.failover.harness.FailoverRun` runs on a
3-node :class:`~outboxkit.embedded.kafka.KafkaCluster`: the test and ``bench/failover.py`` run
the same ones.

Every scenario finds its victim by asking the cluster (:mod:`outboxkit.embedded.kafka_topology`),
takes it down, waits until the pipeline has caught up *without* it (the gap an operator sees),
starts it again on the same data and waits until no partition is under-replicated — as an
operator, or a rolling upgrade, waits before touching the next broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from outboxkit.embedded.kafka import KafkaCluster, KafkaNode
from outboxkit.embedded.kafka_topology import KafkaTopology
from tests.failover.harness import FailoverRun
from tests.helpers import wait_for

#: A scenario: one or more faults in ``run`` (each inside ``run.fault``).
Scenario = Callable[[FailoverRun, KafkaCluster], Awaitable[None]]

#: Seconds after a broker is back in sync within which a window must be as fast as before its
#: loss. A broker's return is a fault of its own: a restarted follower back in the ISR but slow
#: (its JVM warming up beside everything else on the tests' 2 cores) holds every acks=all write
#: to its partitions, the relays' transactions included, until it keeps up or leaves the ISR
#: again after ``replica.lag.time.max.ms`` (10 s on the test brokers, 30 s by default). Windows
#: stayed slower (p50 0.6 to 3.7 s) for 8.5 to 11.8 s after it, and the most delayed events of
#: a broker fault are those committed just after its restart.
BACK_WITHIN = 30.0


async def take_down(run: FailoverRun, node: KafkaNode, *, how: str, name: str, role: str) -> None:
    """One fault: ``node`` killed (``SIGKILL``) or shut down (``SIGTERM``, a controlled
    shutdown), the pipeline recovered without it, then the node restarted and back in sync."""
    async with run.fault(name, back_within=BACK_WITHIN) as fault:
        stop = node.kill if how == "SIGKILL" else node.stop
        await asyncio.to_thread(stop)
        down = time.time()
        await run.settled()
        without = time.time() - fault.started
        await asyncio.to_thread(node.start)
        await wait_for(
            in_sync(run.topology), within=90, interval=0.5, what="no under-replicated partition"
        )
        fault.detail = (
            f"{how} node {node.node_id} ({role}); caught up without it after {without:.1f} s, "
            f"down {time.time() - down:.1f} s"
        )


def in_sync(topology: KafkaTopology) -> Callable[[], Awaitable[bool]]:
    """Whether no partition is under-replicated: a restarted broker is back in service."""

    async def check() -> bool:
        return not await topology.under_replicated()

    return check


async def partition_leader(run: FailoverRun, cluster: KafkaCluster) -> None:
    """SIGKILL the leader of the busiest partition."""
    busiest = run.busiest()
    leader = await run.topology.partition_leader(run.topic, busiest)
    await take_down(
        run,
        cluster.node(leader),
        how="SIGKILL",
        name="partition leader",
        role=f"leader of {run.topic}/{busiest}",
    )


async def transaction_coordinator(run: FailoverRun, cluster: KafkaCluster) -> None:
    """SIGKILL the transaction coordinator of the relays' producer of the busiest partition."""
    transactional_id = await run.relay_transactional_id(run.busiest())
    node = await run.topology.transaction_coordinator(transactional_id)
    await take_down(
        run,
        cluster.node(node),
        how="SIGKILL",
        name="transaction coordinator",
        role=f"coordinator of {transactional_id.rsplit('.', 1)[-1]}",
    )


async def group_coordinators(run: FailoverRun, cluster: KafkaCluster) -> None:
    """SIGKILL the coordinator of the relays' group, then (if another broker) the inbox's."""
    relays = await run.topology.group_coordinator(run.relay_group)
    inbox = await run.topology.group_coordinator(run.inbox_group)
    role = "relays' and inbox's" if relays == inbox else "relays'"
    await take_down(
        run,
        cluster.node(relays),
        how="SIGKILL",
        name="group coordinator",
        role=f"coordinator of the {role} group",
    )
    if relays != inbox:
        # The relays' restart may have moved the inbox's coordinator: ask again.
        inbox = await run.topology.group_coordinator(run.inbox_group)
        await take_down(
            run,
            cluster.node(inbox),
            how="SIGKILL",
            name="group coordinator",
            role="coordinator of the inbox's group",
        )


async def rolling_restart(run: FailoverRun, cluster: KafkaCluster) -> None:
    """A controlled shutdown (SIGTERM) of each broker in turn, restarted, as an upgrade does."""
    for node in cluster.nodes:
        await take_down(
            run, node, how="SIGTERM", name="rolling restart", role="controlled shutdown"
        )


#: Scenario name → scenario. ``bench/failover.py`` runs them by these names (``--only``);
#: database faults are further entries of the same shape.
KAFKA_FAULTS: dict[str, Scenario] = {
    "leader": partition_leader,
    "txn-coordinator": transaction_coordinator,
    "group-coordinator": group_coordinators,
    "rolling": rolling_restart,
}
