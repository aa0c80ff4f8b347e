"""The faults production networks make (issue #41), with Toxiproxy between one process and a
server (tests/network): a relay partitioned from Kafka but not from its database, or from its
database but not from Kafka; a half-open link (data stops, the socket stays open) between a
relay and Kafka and between an inbox worker and its database; latency with jitter on the broker
link.

Each runs :class:`~tests.failover.harness.FailoverRun`'s steady load (writers throughout, two
relays, one inbox worker) on a broker whose listeners ``LINK0..2`` are each reached through a
proxy of their own (``proxied_kafka``): the faulted process talks to Kafka or its database
through a proxy, every other one directly. Afterwards G1, G2, G4 and G6 are checked on what
Kafka and the database hold, every process is healthy again without a restart, and the gap
(the longest commit→Kafka delay of the events committed around the fault) is printed and
bounded.

Which timeout bounds each hang is in docs/operations.md ("Network faults").
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from outboxkit.core.kafka import admin_client
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.relay.ownership import GroupMember, describe_group
from tests.failover.harness import FailoverRun
from tests.helpers import wait_for
from tests.network.fixtures import Links
from tests.network.toxiproxy import Proxy
from tests.timeouts import SESSION_TIMEOUT

#: The longest commit→Kafka delay a fault may cause on this loaded 2-core machine. The targets
#: are the session timeout (3 s in the tests) plus a rebalance, plus a few seconds.
MAX_GAP = 20.0

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.timeout(120)]


async def relay_members(run: FailoverRun) -> list[GroupMember]:
    settings = KafkaConnectionSettings(kafka_bootstrap_servers=run.bootstrap.split(","))
    async with admin_client(settings) as admin:
        state, members = await describe_group(admin, run.relay_group)
    return members if state == "Stable" else []


async def owners(run: FailoverRun) -> int:
    """How many relays own partitions in a stable group (0 while it rebalances)."""
    members = await relay_members(run)
    return sum(1 for m in members if m.assigned)


def run_on(
    kafka_links: Links, tmp_path: Path, url: str, **worker_env: dict[str, str]
) -> FailoverRun:
    """Two relays, one inbox worker, 4 partitions, 100 events/s; ``worker_env`` puts a worker
    behind a proxy."""
    return FailoverRun(
        url,
        kafka_links.bootstrap,
        tmp_path,
        partitions=4,
        relays=2,
        inboxes=1,
        rate=100.0,
        entities=12,
        recovery_timeout=60.0,
        worker_env=dict(worker_env),
    )


def via(proxy: Proxy, url: str) -> str:
    """``url`` with its host and port replaced by the proxy's; a MongoDB URL connects to that
    one member directly (``directConnection``): a replica set's discovery would find the
    member's own address and go around the proxy."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"{netloc[0]}@{proxy.listen}" if len(netloc) == 2 else proxy.listen
    query = parts.query
    if parts.scheme.startswith("mongodb"):
        kept = [q for q in query.split("&") if q and not q.startswith("replicaSet=")]
        query = "&".join([*kept, "directConnection=true"])
    return urlunsplit(parts._replace(netloc=host, query=query))


async def test_relay_partitioned_from_kafka_not_from_its_database(
    pg_url: str, kafka_links: Links, tmp_path: Path
) -> None:
    """relay-0 reaches Kafka through LINK0, which is cut (the proxy closes its connections and
    refuses new ones) while its database stays reachable, with relay-1 healthy. Would catch a
    cut-off relay whose open transaction is not fenced (its records published by two
    producer sessions, interleaved: G4), a record lost between the two (G1) or published out
    of order (G2), partitions that never move, or a relay that does not rejoin once the link
    heals (unhealthy, crashed, or never owning a partition again)."""
    link = kafka_links.proxies[0]
    async with run_on(
        kafka_links,
        tmp_path,
        pg_url,
        **{"relay-0": {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": link.listen}},
    ) as run:
        await wait_for(lambda: _owners_are(run, 2), within=30, what="both relays owning")
        async with run.fault("relay-0 cut from Kafka") as fault:
            fault.detail = "LINK0 disabled, database reachable"
            started = time.monotonic()
            await link.disable()
            await wait_for(
                lambda: _owners_are(run, 1), within=30, interval=0.2, what="relay-1 owning all"
            )
            moved = time.monotonic() - started
            await run.settled()  # relay-1 publishes what relay-0 had claimed
            await link.enable()
            await wait_for(
                lambda: _owners_are(run, 2), within=30, interval=0.2, what="relay-0 rejoined"
            )
        report = await run.finish()
    print(f"\n{report}\npartitions moved {moved:.1f} s after the cut")
    report.assert_ok(max_gap=MAX_GAP)
    assert moved < SESSION_TIMEOUT + 10, f"partitions moved only after {moved:.1f} s"


async def _owners_are(run: FailoverRun, count: int) -> bool:
    try:
        return await owners(run) == count
    except Exception:  # the coordinator is busy with the rebalance: ask again
        return False
