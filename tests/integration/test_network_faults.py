"""The faults production networks make (issue #41), with Toxiproxy between one process and a
server (tests/network): a relay partitioned from Kafka but not from its database, or from its
database but not from Kafka; an inbox worker partitioned from Kafka but not from its database;
a half-open link (data stops, the socket stays open) between a relay or an inbox worker and
Kafka or its database; connection resets; latency with jitter and a narrow link to the broker.

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

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.failover.harness import FailoverRun, Worker
from tests.failover.network_faults import owns_partitions
from tests.helpers import wait_for
from tests.network.fixtures import Links, TestProxies
from tests.network.toxiproxy import Proxy, via
from tests.network.workers import (
    INBOXES,
    MAX_GAP,
    RESETS,
    Steps,
    assigned_to,
    committed_since,
    lapsed,
    metric,
    network_run,
    orphaned_transactions_expire,
    owners_are,
    reset_repeatedly,
    taken_effect,
    worker_health,
)
from tests.timeouts import DATABASE_TIMEOUT, SESSION_TIMEOUT, STEP_ASIDE_AFTER

#: An inbox worker behind a half-open database link reports itself stalled after this long.
INBOX_STALL_AFTER = 3.0

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.timeout(120)]


async def test_relay_kafka_link_cut_half_open_and_slow(
    pg_url: str, kafka_links: Links, tmp_path: Path
) -> None:
    """relay-0 reaches Kafka through LINK0, relay-1 directly; its database stays reachable.
    In turn the link is cut (the proxy closes its connections and refuses new ones), made
    half-open (data stops both ways, the sockets stay open), and slowed (100 to 500 ms per
    response). Would catch a cut-off relay whose open transaction is not fenced (its records
    published by two producer sessions, interleaved: G4), a record lost between the two (G1)
    or published out of order (G2), partitions that never move, a relay that hangs on a dead
    socket for good or does not rejoin once the link heals (unhealthy, crashed, never owning a
    partition again), a half-open relay whose /healthz stays 200 listing partitions the group
    gave to relay-1 (its membership lapsed: it must say so and stop publishing them), latency
    that sets off a rebalance loop, or a connection reset in the middle of a send or a Kafka
    transaction's commit (outcome unknown to the relay) that loses or reorders a record or lets
    two producer sessions of a partition interleave."""
    link = kafka_links.proxies[0]
    async with network_run(
        pg_url,
        kafka_links.bootstrap,
        tmp_path,
        worker_env={"relay-0": {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": link.listen}},
    ) as run:
        relay_0 = run.workers[0]
        moved: dict[str, float] = {}
        await wait_for(lambda: owners_are(run, 2), within=30, what="both relays owning")
        for name, cut in [("cut", link.disable), ("half-open", link.half_open)]:
            async with run.fault(f"relay-0's Kafka link {name}") as fault:
                fault.detail = "LINK0 " + ("disabled" if name == "cut" else "timeout=0 both ways")
                started = time.monotonic()
                await cut()
                await wait_for(
                    lambda: owners_are(run, 1), within=30, interval=0.2, what="one owner"
                )
                moved[name] = time.monotonic() - started
                if name == "half-open":
                    # The coordinator no longer answers relay-0: after the session timeout its
                    # membership has lapsed; it owns nothing and says so.
                    await wait_for(
                        lambda: lapsed(relay_0),
                        within=SESSION_TIMEOUT + 10,
                        interval=0.2,
                        what="relay-0 unhealthy, owning nothing",
                    )
                    moved["half-open, relay-0 unhealthy"] = time.monotonic() - started
                await run.settled()  # relay-1 published what relay-0 had claimed
                await link.heal()
                await wait_for(
                    lambda: owners_are(run, 2), within=45, interval=0.2, what="relay-0 back"
                )
                moved[f"{name}, back"] = time.monotonic() - started
        before = await _rebalances(run)
        fenced = relay_0.process.log().count("partitions fenced")
        async with run.fault("relay-0's Kafka link slow") as fault:
            fault.detail = "LINK0 latency 300±200 ms downstream"
            await link.add_toxic("latency", latency=300, jitter=200)
            # Events still flow through the slow link: what is committed once it is slow
            # reaches Kafka while it is slow (one per key per transaction: a few per second).
            await wait_for(
                committed_since(run, fault.started, 50), within=30, what="50 events committed"
            )
            first = [e for e, at in list(run.writers.committed_at.items()) if at >= fault.started]
            await wait_for(
                lambda: all(e in run.arrivals.arrivals for e in first),
                within=30,
                interval=0.2,
                what="events published through the slow link",
            )
            flowed = time.time() - fault.started
            await link.heal()
        narrow = await narrow_and_sliced(run, link, relay_0)
        rebalances = await _rebalances(run) - before
        fenced = relay_0.process.log().count("partitions fenced") - fenced
        async with run.fault("relay-0's Kafka link reset") as fault:
            # Connections reset in the middle of sends and transaction commits: the outcome of
            # a commit cut this way is unknown to relay-0; its next producer's init settles it
            # (committed, or aborted and published again).
            fault.detail = f"reset_peer {RESETS} times, each once relay-0 had published again"
            reset_published = await reset_repeatedly(link, relay_0)
        report = await run.finish()
    print(f"\n{report}\npartitions moved, relay-0 back (s after the fault): {moved}")
    print(f"slow link: {rebalances:g} rebalances, {fenced} fences; flowed after {flowed:.1f} s")
    print(f"narrow, sliced link: {narrow}")
    print(f"resets: relay-0 published {reset_published} records between them")
    assert report.ok, str(report)
    quick = [g for g in report.faults if "slow" not in g.name and "narrow" not in g.name]
    assert all(g.delivery < MAX_GAP for g in quick), str(report)
    assert (rebalances, fenced) == (0, 0), "latency or a narrow link set off a rebalance or fence"


#: KB/s each way on the narrow link: above relay-0's share of the load (half of 100 events/s of
#: ~0.5 KB), so it keeps up, with every transaction's requests queued behind its records.
NARROW_KBPS = 64


async def narrow_and_sliced(run: FailoverRun, link: Proxy, relay: Worker) -> str:
    """The link's bandwidth cut to :data:`NARROW_KBPS` each way and the broker's replies sliced
    into small pieces (a ``slicer``) while 200 events are committed; what got through."""
    async with run.fault("relay-0's Kafka link narrow and sliced") as fault:
        fault.detail = f"LINK0 {NARROW_KBPS} KB/s each way, replies sliced in 64±32 B every 1 ms"
        await link.add_toxic("bandwidth", stream="upstream", rate=NARROW_KBPS)
        await link.add_toxic("bandwidth", stream="downstream", rate=NARROW_KBPS)
        await link.add_toxic("slicer", average_size=64, size_variation=32, delay=1000)
        await wait_for(
            committed_since(run, fault.started, 200), within=30, what="200 events committed"
        )
        narrow = await delivered(run, relay, fault.started)
        await link.heal()
    return narrow


async def delivered(run: FailoverRun, relay: Worker, since: float) -> str:
    """Throughput and commit→Kafka delays (p50, p99, max) of the events of ``relay``'s
    partitions committed since ``since`` (wall clock), once each has reached Kafka."""
    owned = {int(p.rsplit("/", 1)[1]) for p in (await worker_health(relay)).get("owned", [])}
    due = {e: at for e, at in list(run.writers.committed_at.items()) if at >= since}
    await wait_for(
        lambda: due.keys() <= run.arrivals.arrivals.keys(),
        within=30,
        interval=0.2,
        what="events published through the narrow link",
    )
    arrivals = {e: run.arrivals.arrivals[e] for e in due}
    mine = sorted(a.at - due[e] for e, a in arrivals.items() if a.partition in owned)
    if not mine:
        return "no event of relay-0's partitions"
    took = max(a.at for e, a in arrivals.items() if a.partition in owned) - since
    p50, p99 = mine[len(mine) // 2], mine[min(len(mine) - 1, int(len(mine) * 0.99))]
    return (
        f"{len(mine)} events of relay-0's partitions, {len(mine) / took:.0f}/s, commit→Kafka "
        f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {mine[-1]:.2f} s"
    )


async def _rebalances(run: FailoverRun) -> float:
    """Assignments the relays received so far (``outboxkit_relay_rebalances_total``)."""
    total = 0.0
    for worker in run.workers:
        if worker.name.startswith("relay"):
            total += await metric(worker, "outboxkit_relay_rebalances_total")
    return total


async def test_database_links_cut_and_half_open(
    db_url: str,
    kafka_links: Links,
    toxiproxy: TestProxies,
    tmp_path: Path,
) -> None:
    """relay-0 and inbox-0 reach the database through proxies of their own, relay-1 and
    inbox-1 directly; Kafka stays reachable. In turn: relay-0's database link is cut, made
    half-open (until relay-0 has stepped out of the group and relay-1 has published what was
    committed meanwhile), then reset again and again mid-claim and mid-settle; inbox-0's is made
    half-open (until it has stepped out of its group and inbox-1 has taken effect of what was
    committed meanwhile); inbox-0's is cut while its transactions are in flight (commit outcome
    unknown to it). Would catch an event lost or reordered (G1, G2), two
    publishers of a partition (G4), an effect taken twice or never (G6: a commit whose outcome
    the worker never learnt, retried), a worker that hangs on a silent socket for good (it
    never reports the database unavailable: OUTBOXKIT_DATABASE_TIMEOUT not applied), a relay
    that keeps its partitions while it cannot read its database (on MongoDB nothing else moves
    them: its sessions stay open on the server) or does not rejoin, crashes, or stays unhealthy
    after the link heals."""
    url = db_url
    upstream = urlsplit(url).netloc.rsplit("@", 1)[-1]
    relay_link = await toxiproxy.proxy("relay-db", upstream)
    inbox_link = await toxiproxy.proxy("inbox-db", upstream)
    # On MongoDB a transaction inbox-0 had open when its link went half-open would otherwise
    # hold inbox-1 back for mongod's default 60 s.
    async with (
        orphaned_transactions_expire(url),
        network_run(
            url,
            kafka_links.bootstrap,
            tmp_path,
            inboxes=2,
            recovery_timeout=40.0,
            worker_env={
                "relay-0": {
                    "OUTBOXKIT_DATABASE_URL": via(relay_link, url),
                    "OUTBOXKIT_DATABASE_TIMEOUT": f"{DATABASE_TIMEOUT:g}",
                    "OUTBOXKIT_STEP_ASIDE_AFTER": f"{STEP_ASIDE_AFTER:g}",
                },
                "inbox-0": {
                    "OUTBOXKIT_DATABASE_URL": via(inbox_link, url),
                    "OUTBOXKIT_STALL_AFTER": f"{INBOX_STALL_AFTER:g}",
                    "OUTBOXKIT_DATABASE_TIMEOUT": f"{DATABASE_TIMEOUT:g}",
                    "OUTBOXKIT_STEP_ASIDE_AFTER": f"{STEP_ASIDE_AFTER:g}",
                },
            },
        ) as run,
    ):
        took: dict[str, float] = {}
        relay_0 = next(w for w in run.workers if w.name == "relay-0")
        async with run.fault("relay-0's database link cut") as fault:
            # Held until everything committed meanwhile has taken effect, the link still cut:
            # relay-1 removed relay-0 from the group once its database sessions ended.
            await relay_link.disable()
            cut = time.time()
            await wait_for(committed_since(run, cut, 50), within=30, what="50 events committed")
            await taken_effect(run, time.time(), within=30)
            took["relay-0 cut: its partitions moved and drained"] = time.time() - fault.started
            fault.detail = "cut until drained by relay-1"
            await relay_link.heal()
        await relay_half_open(run, relay_link, took)
        async with run.fault("relay-0's database link reset") as fault:
            # Connections reset in the middle of claims and settles (each settle commits the
            # deletion of what Kafka acknowledged): a settle whose outcome relay-0 never learnt
            # is done again or its records published again, never lost or reordered.
            fault.detail = f"reset_peer {RESETS} times, each once relay-0 had published again"
            await reset_repeatedly(relay_link, relay_0)
        await inbox_half_open(run, inbox_link, took)
        async with run.fault("inbox-0's database link lost mid-commit") as fault:
            # Replies stop first (the database commits, inbox-0 never hears it), then the link
            # is cut: every transaction in flight ends with its outcome unknown to inbox-0.
            # A fault's schedule, not a wait for a condition: replies dropped for 1 s (the
            # commits in flight finish on the server unheard), then the link cut for 2 s.
            fault.detail = "replies dropped 1 s, then cut 2 s"
            await inbox_link.add_toxic("timeout", stream="downstream", timeout=0)
            await asyncio.sleep(1)
            await inbox_link.disable()
            await asyncio.sleep(2)
            await inbox_link.heal()
        report = await run.finish()
    print(f"\n{report}\nseconds after the fault: {took}")
    report.assert_ok(max_gap=MAX_GAP)


async def relay_half_open(run: FailoverRun, relay_link: Proxy, took: dict[str, float]) -> None:
    """relay-0's database link half-open until relay-0 has stepped out of the group and relay-1
    has published what was committed meanwhile; then healed, until relay-0 owns partitions
    again. ``took`` gets the seconds each step took."""
    relay_0 = next(w for w in run.workers if w.name == "relay-0")
    async with run.fault("relay-0's database link half-open") as fault:
        # relay-0's reads give up after OUTBOXKIT_DATABASE_TIMEOUT ("database unavailable",
        # retried) while its heartbeats go on; after OUTBOXKIT_STEP_ASIDE_AFTER it leaves
        # the group and relay-1 publishes its partitions (held until everything committed
        # meanwhile has taken effect); once the link heals it joins again by itself.
        fault.detail = (
            f"timeout=0 until relay-1 drained relay-0's partitions (database timeout "
            f"{DATABASE_TIMEOUT:g} s, step aside after {STEP_ASIDE_AFTER:g} s)"
        )
        # Only a relay that reads its partitions has a read to give up: relay-0 must have
        # rejoined since the cut (under load it may not have when the cut's fault ended).
        await wait_for(
            lambda: owns_partitions(relay_0),
            within=60,
            interval=0.2,
            what="relay-0 to own partitions again",
        )
        silences = _silences(relay_0)
        await relay_link.half_open()
        steps = Steps(took, "relay-0 half-open", time.time())
        await steps.until(
            "database unavailable",
            lambda: _silences(relay_0) > silences,
            what="relay-0 giving up a read on the silent database",
        )
        await steps.until(
            "stepped aside",
            lambda: _stepped_aside(relay_0),
            what="relay-0 stepping out of its group",
        )
        await taken_effect(run, time.time(), within=30)
        steps.reached("its partitions drained by relay-1")
        await relay_link.heal()
        steps.restart()
        await steps.until(
            "rejoined after the heal",
            lambda: owns_partitions(relay_0),
            within=60,
            what="relay-0 to rejoin and own partitions again",
        )


async def inbox_half_open(run: FailoverRun, inbox_link: Proxy, took: dict[str, float]) -> None:
    """inbox-0's database link half-open until inbox-0 has stepped out of its group and
    inbox-1 has taken effect of what was committed meanwhile; then healed, until inbox-0 holds
    partitions again. ``took`` gets the seconds each step took."""
    inbox_0, inbox_1 = (next(w for w in run.workers if w.name == n) for n in INBOXES)
    async with run.fault("inbox-0's database link half-open") as fault:
        # inbox-0's reads and commits give up after OUTBOXKIT_DATABASE_TIMEOUT: /healthz says
        # the database is unavailable; after OUTBOXKIT_STEP_ASIDE_AFTER it leaves its group and
        # inbox-1 reads its partitions from their last committed offsets (its dedupe records
        # deciding what had committed); once the link heals it rejoins by itself.
        fault.detail = (
            f"timeout=0 until inbox-1 took effect of everything committed meanwhile (database "
            f"timeout {DATABASE_TIMEOUT:g} s, step aside after {STEP_ASIDE_AFTER:g} s)"
        )
        await wait_for(lambda: assigned_to(inbox_0, 1), within=60, interval=0.2, what="inbox-0 in")
        await inbox_link.half_open()
        steps = Steps(took, "inbox-0 half-open", time.time())
        await steps.until(
            "database unavailable",
            lambda: _database_unavailable(inbox_0),
            what="inbox-0 reporting the database unavailable",
        )
        await steps.until(
            "stepped aside",
            lambda: _inbox_stepped_aside(inbox_0),
            what="inbox-0 stepping out of its group",
        )
        await wait_for(
            lambda: assigned_to(inbox_1, 4),
            within=SESSION_TIMEOUT + 20,
            interval=0.2,
            what="inbox-1 holding every partition",
        )
        await taken_effect(run, time.time(), within=30)
        steps.reached("its partitions drained by inbox-1")
        await inbox_link.heal()
        steps.restart()
        await steps.until(
            "rejoined after the heal",
            lambda: assigned_to(inbox_0, 1),
            within=60,
            what="inbox-0 holding partitions again",
        )


async def _inbox_stepped_aside(worker: Worker) -> bool:
    """An inbox worker's /healthz is 503 for a database it cannot reach, holding no partition."""
    health = await worker_health(worker)
    return bool(health.get("stepped_aside_for")) and health.get("assigned") == []


async def _stepped_aside(worker: Worker) -> bool:
    """A relay's /healthz is 503 for a database it cannot read, listing no partition."""
    health = await worker_health(worker)
    return bool(health.get("stepped_aside_for")) and health.get("owned") == []


#: How a wait on the silent database is reported: a read cut by OUTBOXKIT_DATABASE_TIMEOUT (by
#: outboxkit's psycopg connection, and by pymongo, which names its configured timeouts in every
#: network error), or, when the link went silent while the pool was reconnecting (after the
#: cut), a new connection that timed out (OUTBOXKIT_CONNECT_TIMEOUT: psycopg's pool).
_SILENCE = (
    "sent nothing for",
    "timed out (configured timeouts: socketTimeoutMS",
    "connection timeout expired",
    "couldn't get a connection after",
)


def _silences(worker: Worker) -> int:
    """How many reads the worker has given up on a silent database, as its log says."""
    log = worker.process.log()
    return sum(log.count(words) for words in _SILENCE)


async def _reports_silence(worker: Worker) -> bool:
    """The worker's last error is a read given up on a silent database."""
    error = (await worker_health(worker)).get("last_error") or ""
    return any(words in error for words in _SILENCE)


async def _database_unavailable(worker: Worker) -> bool:
    """An inbox worker's /healthz says the database is unavailable, for a silent read."""
    health = await worker_health(worker)
    return health.get("database_available") is False and await _reports_silence(worker)
