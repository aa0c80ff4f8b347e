"""Fixtures of the network-fault tests (a pytest plugin: tests/conftest.py loads it).

- ``toxiproxy_server`` (session): one ``toxiproxy-server`` per test worker on a free loopback
  port, built first if it is not cached (never a skip: a build that fails fails the test);
- ``toxiproxy`` (test): a client of it whose proxies (``await toxiproxy.proxy(name, upstream)``)
  are deleted after the test;
- ``proxied_kafka`` (session): a single-node broker with :data:`LINKS` listeners besides
  PLAINTEXT, each advertised on the port of a proxy in front of it — a client bootstrapped on
  ``links[i]`` reaches the broker, its partition leaders and its coordinators through that one
  proxy only, so a test cuts one process's link and no other's; ``kafka_links`` (test) gives
  the proxies and heals them (enabled, no toxic) after the test;
- ``advertise_node_links``: the same for every node of a larger cluster, one proxy per link and
  node, so that a test cuts one process off one broker (test_network_faults_cluster.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from outboxkit.embedded.kafka import KafkaCluster
from tests.gotools import GoBuildError
from tests.network.toxiproxy import Proxy, Toxiproxy, ToxiproxyError, ToxiproxyServer

#: Proxied Kafka listeners: one per process a test may cut off.
LINKS = 3


class ProxiedKafka(KafkaCluster):
    extra_listeners: ClassVar[dict[str, str]] = {f"LINK{i}": "PLAINTEXT" for i in range(LINKS)}


@dataclass(frozen=True)
class KafkaLinks:
    """The broker's direct bootstrap (the test's own clients) and, per link, the bootstrap
    through its proxy and the proxy's name on the session's Toxiproxy server."""

    bootstrap: str
    link_bootstraps: tuple[str, ...]
    proxy_names: tuple[str, ...]
    upstreams: tuple[str, ...]


class Links:
    """The session's Kafka links as proxies of this test's client."""

    def __init__(self, kafka: KafkaLinks, client: Toxiproxy) -> None:
        self.bootstrap = kafka.bootstrap
        self.proxies = [
            Proxy(client, name, bootstrap, upstream)
            for name, bootstrap, upstream in zip(
                kafka.proxy_names, kafka.link_bootstraps, kafka.upstreams, strict=True
            )
        ]

    def bootstrap_of(self, link: int) -> str:
        return self.proxies[link].listen


@pytest.fixture(scope="session")
def toxiproxy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyServer]:
    try:
        server = ToxiproxyServer(tmp_path_factory.mktemp("toxiproxy")).start()
    except (ToxiproxyError, GoBuildError) as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def toxiproxy(toxiproxy_server: ToxiproxyServer) -> AsyncIterator[TestProxies]:
    async with Toxiproxy(toxiproxy_server.url) as client:
        proxies = TestProxies(client)
        try:
            yield proxies
        finally:
            for proxy in proxies.created:
                with contextlib.suppress(ToxiproxyError):
                    await proxy.delete()


class TestProxies:
    """Makes proxies for one test (deleted afterwards)."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, client: Toxiproxy) -> None:
        self.client = client
        self.created: list[Proxy] = []

    async def proxy(self, name: str, upstream: str) -> Proxy:
        proxy = await self.client.create(f"{name}-{uuid.uuid4().hex[:6]}", upstream)
        self.created.append(proxy)
        return proxy


async def advertise_links(client: Toxiproxy, cluster: ProxiedKafka) -> list[Proxy]:
    """A proxy in front of each ``LINK`` listener of ``cluster``'s (single) node, advertised on
    the proxy's port (before the cluster starts): a client bootstrapped on a proxy stays behind
    it."""
    per_node = await advertise_node_links(client, cluster)
    [node] = cluster.nodes
    return [per_node[i][node.node_id] for i in range(LINKS)]


async def advertise_node_links(
    client: Toxiproxy, cluster: ProxiedKafka
) -> dict[int, dict[int, Proxy]]:
    """Per link, per node id: a proxy in front of that node's ``LINK`` listener, advertised on
    the proxy's port (before the cluster starts). A client bootstrapped on one link's proxies
    reaches every broker through them only, so a test cuts one process off one broker."""
    links: dict[int, dict[int, Proxy]] = {i: {} for i in range(LINKS)}
    for node in cluster.nodes:
        for i in range(LINKS):
            upstream = node.listener_address(f"LINK{i}")
            name = f"kafka-link{i}-node{node.node_id}-{uuid.uuid4().hex[:6]}"
            proxy = await client.create(name, upstream)
            node.advertised_ports[f"LINK{i}"] = proxy.port
            links[i][node.node_id] = proxy
    return links


@contextlib.contextmanager
def behind_proxies(
    cluster: ProxiedKafka, toxiproxy_url: str
) -> Iterator[dict[int, dict[int, Proxy]]]:
    """``cluster`` started with every node's links behind proxies of ``toxiproxy_url``
    (:func:`advertise_node_links`); yields them per link, per node id. The proxies' client is
    closed: a test makes its own from their names."""

    async def create() -> dict[int, dict[int, Proxy]]:
        async with Toxiproxy(toxiproxy_url) as client:
            return await advertise_node_links(client, cluster)

    links = asyncio.run(create())
    with cluster.start():
        yield links


@pytest.fixture(scope="session")
def proxied_kafka(
    request: pytest.FixtureRequest,
    toxiproxy_server: ToxiproxyServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KafkaLinks]:
    jars: Path = request.getfixturevalue("kafka_jars")
    base = tmp_path_factory.mktemp("proxied-kafka")
    cluster = ProxiedKafka(1, jars_dir=jars, base_dir=base, quick_jvm=True)
    with behind_proxies(cluster, toxiproxy_server.url) as links:
        [node] = cluster.nodes
        proxies = [links[i][node.node_id] for i in range(LINKS)]
        yield KafkaLinks(
            bootstrap=cluster.bootstrap_servers,
            link_bootstraps=tuple(p.listen for p in proxies),
            proxy_names=tuple(p.name for p in proxies),
            upstreams=tuple(p.upstream for p in proxies),
        )


@pytest.fixture
async def kafka_links(proxied_kafka: KafkaLinks, toxiproxy: TestProxies) -> AsyncIterator[Links]:
    links = Links(proxied_kafka, toxiproxy.client)
    try:
        yield links
    finally:
        for proxy in links.proxies:
            await proxy.heal()
