"""Network faults between one relay and its servers, each a scenario a
:class:`~tests.failover.harness.FailoverRun` runs with ``relay-0`` behind two Toxiproxy proxies
(:class:`RelayLinks`: its Kafka link and its database link; every other process connects
directly). ``bench/failover.py --only net-…`` runs them under a longer load and prints, per
fault, the gap and the p99 commit→Kafka delay of the events committed during it;
tests/integration/test_network_faults.py asserts the same faults, and more, on its own schedule.

A fault that the other relays can take over from (relay-0 cut off from Kafka; or from its
database: its database sessions end and the others remove it from the group, or, on a
half-open link, which ends no session, it steps out of the group after
``OUTBOXKIT_STEP_ASIDE_AFTER``) is held until they have published everything committed
meanwhile. The slow link is held :data:`HOLD` seconds and the gap shows what it held back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from tests.failover.harness import FailoverRun, Worker
from tests.helpers import http_client, wait_for
from tests.network.toxiproxy import Proxy

#: Seconds a fault that nothing takes over from (a slow link) is held.
HOLD = 15.0


@dataclass(frozen=True)
class RelayLinks:
    """``relay-0``'s links: to Kafka (its bootstrap and every broker it is told of) and to its
    database."""

    kafka: Proxy
    database: Proxy


Scenario = Callable[[FailoverRun, RelayLinks], Awaitable[None]]


async def kafka_cut(run: FailoverRun, links: RelayLinks) -> None:
    """relay-0's Kafka link cut until the other relays publish its partitions.

    The proxy closes its connections and refuses new ones."""
    await _taken_over(run, "relay-0's Kafka link cut", links.kafka, links.kafka.disable)


async def kafka_half_open(run: FailoverRun, links: RelayLinks) -> None:
    """relay-0's Kafka link half-open until the other relays publish its partitions.

    Data stops, the sockets stay open: the group coordinator ends relay-0's membership after
    its session timeout."""
    await _taken_over(run, "relay-0's Kafka link half-open", links.kafka, links.kafka.half_open)


async def kafka_slow(run: FailoverRun, links: RelayLinks) -> None:
    """relay-0's Kafka replies 300±200 ms late, for 15 s (:data:`HOLD`)."""

    async def slow() -> None:
        await links.kafka.add_toxic("latency", latency=300, jitter=200)

    await _held(run, "relay-0's Kafka link slow", links.kafka, slow)


async def database_cut(run: FailoverRun, links: RelayLinks) -> None:
    """relay-0's database link cut until the other relays publish its partitions.

    They see its database sessions end and remove it from the group."""
    await _taken_over(run, "relay-0's database link cut", links.database, links.database.disable)


async def database_half_open(run: FailoverRun, links: RelayLinks) -> None:
    """relay-0's database link half-open until the other relays publish its partitions.

    Its reads give up after OUTBOXKIT_DATABASE_TIMEOUT and are retried; no session ends, and
    relay-0 steps out of its group after OUTBOXKIT_STEP_ASIDE_AFTER."""
    await _taken_over(
        run, "relay-0's database link half-open", links.database, links.database.half_open
    )


NETWORK_FAULTS: dict[str, Scenario] = {
    "net-kafka-cut": kafka_cut,
    "net-kafka-half-open": kafka_half_open,
    "net-kafka-slow": kafka_slow,
    "net-db-cut": database_cut,
    "net-db-half-open": database_half_open,
}


async def _taken_over(
    run: FailoverRun, name: str, link: Proxy, inject: Callable[[], Awaitable[object]]
) -> None:
    await _fault(run, name, link, inject, until="the other relays caught up", ended=run.settled)


async def _held(
    run: FailoverRun, name: str, link: Proxy, inject: Callable[[], Awaitable[object]]
) -> None:
    # A fault's schedule: nothing ends it sooner.
    await _fault(
        run, name, link, inject, until=f"{HOLD:g} s passed", ended=lambda: asyncio.sleep(HOLD)
    )


async def _fault(
    run: FailoverRun,
    name: str,
    link: Proxy,
    inject: Callable[[], Awaitable[object]],
    *,
    until: str,
    ended: Callable[[], Awaitable[None]],
) -> None:
    """``inject`` on ``link`` once relay-0 owns partitions (there is something to take over),
    healed once ``ended`` returns; then until relay-0 owns partitions again."""
    await _rejoined(run)
    async with run.fault(name) as fault:
        fault.detail = f"until {until}"
        await inject()
        await ended()
        await link.heal()
    await _rejoined(run)


async def _rejoined(run: FailoverRun) -> None:
    """Until relay-0 owns partitions."""
    relay = next(w for w in run.workers if w.name == "relay-0")
    await wait_for(
        lambda: owns_partitions(relay), within=90, interval=0.5, what="relay-0 owning again"
    )


async def owns_partitions(worker: Worker) -> bool:
    """Whether ``worker`` (a relay) lists partitions it owns on its ``/healthz``."""
    try:
        async with http_client() as http:
            response = await http.get(f"http://127.0.0.1:{worker.port}/healthz", timeout=2)
            return bool(response.json().get("owned"))
    except (httpx.HTTPError, OSError, ValueError):
        return False
