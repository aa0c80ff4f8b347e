"""What the network-fault tests ask of :class:`~tests.failover.harness.FailoverRun`'s workers
and events: their ``/healthz`` and ``/metrics``, the events committed and taken effect since a
moment, and connection resets timed by a worker's progress."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from outboxkit.core.kafka import admin_client
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.relay.ownership import GroupMember, describe_group
from tests.failover.harness import FailoverRun, Worker
from tests.helpers import http_client, wait_for
from tests.integration.inbox_harness import mongo_client
from tests.network.toxiproxy import Proxy
from tests.timeouts import ORPHANED_TRANSACTION_LIFETIME

#: The longest commit→Kafka delay a fault may cause on this loaded 2-core machine. The targets
#: are the session timeout (3 s in the tests) plus a rebalance, plus a few seconds.
MAX_GAP = 20.0


def committed_since(run: FailoverRun, moment: float, count: int) -> Callable[[], bool]:
    """Whether the writers have committed ``count`` events since ``moment`` (wall clock)."""

    def check() -> bool:
        return sum(1 for at in list(run.writers.committed_at.values()) if at >= moment) >= count

    return check


async def metric(worker: Worker, name: str) -> float:
    """The sum of ``name``'s samples on the worker's /metrics (0 while it does not answer)."""
    try:
        async with http_client() as http:
            text = (await http.get(f"http://127.0.0.1:{worker.port}/metrics", timeout=5)).text
    except (httpx.HTTPError, OSError):
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


#: Connection resets per reset fault: the relay publishes all the time (100 events/s), so each
#: reset cuts whatever is in flight — a send, a transaction's commit, a claim, a settle.
RESETS = 4


async def reset_repeatedly(
    link: Proxy, worker: Worker, progress: str = "outboxkit_relay_published_total"
) -> int:
    """Reset every connection through ``link`` (``reset_peer``), :data:`RESETS` times, each
    once ``worker`` has made progress again since the last (its ``progress`` counter: records
    a relay published, or an inbox worker handled); how much progress it made meanwhile."""
    first = await metric(worker, progress)
    published = first
    for _ in range(RESETS):
        await wait_for(
            lambda count=published: progressed_since(worker, progress, count),
            within=30,
            interval=0.1,
            what=f"{worker.name} making progress again",
        )
        published = await metric(worker, progress)
        await link.add_toxic("reset_peer", stream="upstream", timeout=0)
        # The toxic resets the links it is added to, and every new one: removed at once (a
        # fault's schedule), the worker reconnects.
        await asyncio.sleep(0.1)
        await link.heal()
    return int(published - first)


async def progressed_since(worker: Worker, progress: str, count: float) -> bool:
    return await metric(worker, progress) > count


async def taken_effect(run: FailoverRun, moment: float, *, within: float) -> None:
    """Wait until every event committed by ``moment`` has reached Kafka and taken effect, each
    by its id (:meth:`FailoverRun.settled` counts effects: a worker stuck on its partitions
    would hide behind the other's later effects)."""
    due = {e for e, at in list(run.writers.committed_at.items()) if at <= moment}

    async def effective() -> bool:
        return due <= (await run.effect_times()).keys()

    await wait_for(effective, within=within, interval=0.5, what="every event's effect")


async def worker_health(worker: Worker) -> dict[str, Any]:
    """The worker's /healthz as JSON ({} while it does not answer)."""
    try:
        async with http_client() as http:
            response = await http.get(f"http://127.0.0.1:{worker.port}/healthz", timeout=2)
            return dict(response.json())
    except (httpx.HTTPError, OSError, ValueError):
        return {}


#: The inbox workers of :class:`FailoverRun`.
INBOXES = ("inbox-0", "inbox-1")


async def assigned_to(worker: Worker, count: int) -> bool:
    """Whether an inbox worker's /healthz lists at least ``count`` assigned partitions."""
    return len((await worker_health(worker)).get("assigned", [])) >= count


async def relay_members(run: FailoverRun) -> list[GroupMember]:
    settings = KafkaConnectionSettings(kafka_bootstrap_servers=run.bootstrap.split(","))
    async with admin_client(settings) as admin:
        state, members = await describe_group(admin, run.relay_group)
    return members if state == "Stable" else []


async def owners(run: FailoverRun) -> int:
    """How many relays own partitions in a stable group (0 while it rebalances)."""
    members = await relay_members(run)
    return sum(1 for m in members if m.assigned)


async def owners_are(run: FailoverRun, count: int) -> bool:
    """Whether exactly ``count`` relays own partitions in a stable group."""
    try:
        return await owners(run) == count
    except Exception:  # the coordinator is busy with the rebalance: ask again
        return False


async def lapsed(worker: Worker) -> bool:
    """A relay's /healthz is 503 for a lapsed membership, listing no partition."""
    health = await worker_health(worker)
    return bool(health.get("membership_lapsed_for")) and health.get("owned") == []


@contextlib.asynccontextmanager
async def orphaned_transactions_expire(url: str) -> AsyncIterator[None]:
    """On MongoDB, mongod's ``transactionLifetimeLimitSeconds`` at
    :data:`~tests.timeouts.ORPHANED_TRANSACTION_LIFETIME` for the block, restored after it.

    A worker whose database link goes half-open may leave a transaction open on mongod: its
    writes never end, and a session outlives its connections, so nothing ends it but the
    lifetime limit (or the worker, once the link heals). Until then the worker that takes its
    partitions over retries write conflicts on the same dedupe records (docs/mongodb.md). The
    inbox reads the limit when it starts, so the block must hold the workers. PostgreSQL rolls
    such a transaction back when the worker gives its connection up: nothing to do there."""
    if not url.startswith("mongodb"):
        yield
        return
    name = "transactionLifetimeLimitSeconds"
    async with mongo_client(url) as client:
        was = (await client.admin.command({"getParameter": 1, name: 1}))[name]
        await client.admin.command({"setParameter": 1, name: ORPHANED_TRANSACTION_LIFETIME})
        try:
            yield
        finally:
            await client.admin.command({"setParameter": 1, name: was})


def network_run(
    url: str,
    bootstrap: str,
    tmp_path: Path,
    *,
    relays: int = 2,
    inboxes: int = 1,
    recovery_timeout: float = 60.0,
    worker_env: dict[str, dict[str, str]],
) -> FailoverRun:
    """The network tests' load: 4 partitions, 100 events/s over 12 keys, ``relays`` relays and
    ``inboxes`` inbox workers; ``worker_env`` puts some of them behind proxies."""
    return FailoverRun(
        url,
        bootstrap,
        tmp_path,
        partitions=4,
        relays=relays,
        inboxes=inboxes,
        rate=100.0,
        entities=12,
        recovery_timeout=recovery_timeout,
        worker_env=worker_env,
    )


@dataclass
class Steps:
    """The seconds each step of a fault took, from ``since`` (wall clock), into ``took`` as
    ``"<fault>: <step>"``: :meth:`until` waits for a step's condition, then records it."""

    took: dict[str, float]
    fault: str
    since: float

    def reached(self, step: str) -> None:
        self.took[f"{self.fault}: {step}"] = time.time() - self.since

    def restart(self) -> None:
        """Time the next steps from now."""
        self.since = time.time()

    async def until(
        self,
        step: str,
        condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
        *,
        what: str,
        within: float = 30,
    ) -> None:
        await wait_for(condition, within=within, interval=0.2, what=what)
        self.reached(step)
