"""A relay cut off from one broker of a three-node Kafka cluster: the broker that
coordinates its group. It still reaches the others — partition leaders, transaction
coordinators — but its heartbeats go unanswered: the group coordinator drops it after the
session timeout and gives its partitions to the other relay, whose first transactions fence
whatever it still sends through the brokers it reaches. Every broker is reached through a proxy
per link (tests/network): relay-0 through link 0's three proxies, everything else directly.

Afterwards G1, G2, G4 and G6 are checked on what Kafka and the database hold (tests/failover),
every process is healthy again without a restart, and the gap is printed and bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from outboxkit.embedded.kafka_topology import KafkaTopology
from tests.failover.harness import Worker
from tests.helpers import wait_for
from tests.network.fixtures import ProxiedKafka, TestProxies, behind_proxies
from tests.network.toxiproxy import Proxy, ToxiproxyServer
from tests.network.workers import (
    MAX_GAP,
    Steps,
    lapsed,
    metric,
    network_run,
    owners_are,
    worker_health,
)
from tests.timeouts import SESSION_TIMEOUT, STEP_ASIDE_AFTER

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.timeout(180)]


@dataclass(frozen=True)
class ClusterLinks:
    """The cluster's direct bootstrap and, per node id, link 0's proxy in front of it."""

    bootstrap: str
    #: node id → (proxy name, listen address, upstream)
    link0: dict[int, tuple[str, str, str]]


@pytest.fixture(scope="module")
def proxied_cluster(
    request: pytest.FixtureRequest,
    toxiproxy_server: ToxiproxyServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterLinks]:
    jars: Path = request.getfixturevalue("kafka_jars")
    cluster = ProxiedKafka(
        3, jars_dir=jars, base_dir=tmp_path_factory.mktemp("proxied-cluster"), quick_jvm=True
    )
    with behind_proxies(cluster, toxiproxy_server.url) as links:
        link0 = {node: (p.name, p.listen, p.upstream) for node, p in links[0].items()}
        yield ClusterLinks(cluster.bootstrap_servers, link0)


async def test_a_relay_cut_from_its_group_coordinator_only(
    pg_url: str, proxied_cluster: ClusterLinks, toxiproxy: TestProxies, tmp_path: Path
) -> None:
    """relay-0 reaches every broker through a proxy of its own; the one in front of its group's
    coordinator is cut, the two others stay. Would catch a relay that keeps publishing, and
    reporting healthy, partitions the group gave away because it still reaches their leaders
    (its membership must lapse), a transaction of it that commits after the other relay took
    its partitions (two publishers interleaved: G4), a record lost or reordered (G1, G2), or a
    relay that does not rejoin once the link heals."""
    proxies = {
        node: Proxy(toxiproxy.client, name, listen, upstream)
        for node, (name, listen, upstream) in proxied_cluster.link0.items()
    }
    async with network_run(
        pg_url,
        proxied_cluster.bootstrap,
        tmp_path,
        worker_env={
            "relay-0": {
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": ",".join(p.listen for p in proxies.values())
            }
        },
    ) as run:
        relay_0 = next(w for w in run.workers if w.name == "relay-0")
        took: dict[str, float] = {}
        await wait_for(
            lambda: owners_are(run, 2), within=60, interval=0.2, what="both relays owning"
        )
        async with KafkaTopology(proxied_cluster.bootstrap) as topology:
            coordinator = await topology.group_coordinator(run.relay_group)
            leaders = await topology.leaders(run.topic)
        async with run.fault("relay-0 cut from its group's coordinator") as fault:
            fault.detail = (
                f"relay-0's proxy to node {coordinator} off (partition leaders: {leaders}), "
                "until relay-1 published everything"
            )
            try:
                await proxies[coordinator].disable()
                steps = Steps(took, "cut", time.time())
                await steps.until(
                    "partitions moved",
                    lambda: owners_are(run, 1),
                    within=SESSION_TIMEOUT + 20,
                    what="relay-1 owning every partition",
                )
                await steps.until(
                    "relay-0 lapsed",
                    lambda: lapsed(relay_0),
                    within=2 * SESSION_TIMEOUT + 20,
                    what="relay-0's membership lapsed (unhealthy, owning nothing)",
                )
                await run.settled()
            finally:
                await proxies[coordinator].enable()
            await steps.until(
                "relay-0 back", lambda: owners_are(run, 2), within=60, what="relay-0 back"
            )
        report = await run.finish()
    print(f"\n{report}\nseconds after the cut: {took}")
    report.assert_ok(max_gap=MAX_GAP)


async def test_a_relay_cut_from_the_leader_of_its_partitions_steps_aside_from_them(
    pg_url: str, proxied_cluster: ClusterLinks, toxiproxy: TestProxies, tmp_path: Path
) -> None:
    """relay-0 reaches every broker through a proxy of its own; the one in front of the leader
    of its partitions is cut, its group's coordinator stays reachable. Its heartbeats go on, so
    the group leaves it those partitions: before, their records waited until the link healed,
    and nothing said so until OUTBOXKIT_STALL_AFTER. Now the block is stuck once its send has
    run OUTBOXKIT_STEP_ASIDE_AFTER with records pending: relay-0 says so (/healthz ``stuck``,
    503) and steps aside from those partitions, rejoining with a request not to be given them;
    relay-1 publishes them while the link is still cut, and relay-0 the others — or, when the
    cut broker also coordinates the other block's transactions, relay-0 can publish nothing it
    is given and leaves the group until its request lapses. Would catch a relay that holds
    them, one that takes them back at once (the request ignored), relays that hand a range they
    cannot publish back and forth, a record lost or reordered, or two publishers interleaved
    (G4).

    The leaders are placed: partitions 0-1 on one broker, 2-3 on another, the relays' group
    coordinator on neither, so that relay-0's range (0-1 or 2-3) has one leader to cut and the
    other range none."""
    proxies = {
        node: Proxy(toxiproxy.client, name, listen, upstream)
        for node, (name, listen, upstream) in proxied_cluster.link0.items()
    }
    run = network_run(
        pg_url,
        proxied_cluster.bootstrap,
        tmp_path,
        worker_env={
            "relay-0": {
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": ",".join(p.listen for p in proxies.values()),
                "OUTBOXKIT_STEP_ASIDE_AFTER": f"{STEP_ASIDE_AFTER:g}",
            }
        },
    )
    async with KafkaTopology(proxied_cluster.bootstrap) as topology:
        coordinator = await topology.group_coordinator(run.relay_group)
    first, second = (node for node in sorted(proxies) if node != coordinator)
    run.replica_assignment = {
        p: [lead, other, coordinator]
        for p, (lead, other) in enumerate([(first, second)] * 2 + [(second, first)] * 2)
    }
    async with run:
        relay_0 = next(w for w in run.workers if w.name == "relay-0")
        took: dict[str, float] = {}
        await wait_for(
            lambda: owners_are(run, 2), within=60, interval=0.2, what="both relays owning"
        )
        mine = sorted((await worker_health(relay_0)).get("owned", []))
        leader = run.replica_assignment[int(mine[0].rsplit("/", 1)[1])][0]
        async with run.fault("relay-0 cut from the leader of its partitions") as fault:
            fault.detail = (
                f"relay-0's proxy to node {leader} off (leader of {', '.join(mine)}; the "
                f"group's coordinator node {coordinator} reachable), until relay-1 published "
                "everything"
            )
            try:
                await proxies[leader].disable()
                steps = Steps(took, "cut", time.time())
                await steps.until(
                    "relay-0 says stuck",
                    lambda: says_stuck(relay_0, mine),
                    within=STEP_ASIDE_AFTER + 20,
                    what="relay-0's /healthz listing its partitions stuck",
                )
                await steps.until(
                    "relay-0 stepped aside",
                    lambda: owns_none_of(relay_0, mine),
                    within=30,
                    what="relay-0 owning none of its stuck partitions",
                )
                await run.settled()  # relay-1 published them, the link still cut
                steps.reached("caught up, link still cut")
                fault.seen = (
                    f"relay-0 /healthz stuck {mine}, outboxkit_relay_stuck_partitions "
                    f"{await metric(relay_0, 'outboxkit_relay_stuck_partitions'):g} at its peak"
                )
            finally:
                await proxies[leader].enable()
            await steps.until(
                "relay-0 owns partitions", lambda: owners_are(run, 2), within=60, what="back"
            )
        report = await run.finish()
    print(f"\n{report}\nseconds after the cut: {took}")
    report.assert_ok(max_gap=MAX_GAP)
    assert "stepping aside from them" in relay_0.process.log()


async def says_stuck(worker: Worker, partitions: list[str]) -> bool:
    """Whether a relay's /healthz lists ``partitions`` as stuck."""
    return set(partitions) <= set((await worker_health(worker)).get("stuck") or [])


async def owns_none_of(worker: Worker, partitions: list[str]) -> bool:
    owned = (await worker_health(worker)).get("owned")
    return owned is not None and not set(partitions) & set(owned)
