"""A relay cut off from one broker of a three-node Kafka cluster (issue #41): the broker that
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
from tests.helpers import wait_for
from tests.network.fixtures import ProxiedKafka, TestProxies, behind_proxies
from tests.network.toxiproxy import Proxy, ToxiproxyServer
from tests.network.workers import MAX_GAP, Steps, lapsed, network_run, owners_are
from tests.timeouts import SESSION_TIMEOUT

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
