"""outboxkit on a three-member MongoDB replica set while its primary goes away: 3 relays and
2 inbox workers under a steady write load, the primary stepped down (``replSetStepDown``),
SIGKILLed, and every member restarted in turn (a rolling restart), one after the other on one
set. Afterwards G1, G2, G4 and G6 hold on what Kafka and the database hold, the writers'
transactions were retried into no duplicate business effect, every process is healthy again
without a restart and logged no traceback, and no fault held events back longer than
``MAX_GAP``.

The harness is :mod:`tests.failover`, the faults :mod:`tests.failover.mongodb_faults`;
``bench/failover.py`` runs the same scenarios, also with mongod's default 10 s election
timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from outboxkit.core.mongodb import guarded, make_client
from outboxkit.embedded.mongodb import EmbeddedMongo, EmbeddedMongoReplicaSet, ReplicaSetMember
from outboxkit.relay import StorageUnavailableError
from outboxkit.relay.mongodb.presence import MongoPresence
from outboxkit.relay.presence import RECONNECT_GRACE
from tests.failover.harness import FailoverRun
from tests.failover.mongodb_faults import MONGODB_FAULTS
from tests.helpers import holds_for
from tests.integration.conftest import migrate_mongodb_database
from tests.integration.inbox_app import Payment
from tests.integration.step_writers import business_counts

#: Longest commit→Kafka or Kafka→effect delay a fault may cause on this noisy 2-core machine.
#: The target is the election (2 s without heartbeats in these tests) plus 5 s.
MAX_GAP = 30.0

#: PyMongo 4.20's ``pool_shared._async_create_connection`` closes its new socket on a timeout
#: or OSError but not when its task is cancelled mid-connect (shown alone: a connect to a full
#: accept queue, cancelled, leaks a ``socket.socket`` allocated at pool_shared.py:640), and an
#: election cancels the writers' connects to the old primary. The leaked socket is reported
#: when the garbage collector finds it, in whatever code runs then, so only its text can be
#: filtered: a raw TCP ``socket.socket`` (this process's other clients, aiokafka's, are asyncio
#: transports and would be reported as such).
pytestmark = [
    pytest.mark.filterwarnings(
        r"ignore:unclosed <socket\.socket fd=\d+, family=2, type=1, proto=6:ResourceWarning"
    ),
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket fd=\d+, family=2, type=1, proto=6"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(300)
async def test_step_down_kill_and_rolling_restart_of_the_primary(
    mongo_replica_set_factory: Callable[..., EmbeddedMongoReplicaSet],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    """Would catch an event lost or reordered across a failover (a change stream that never
    resumes and no sweep, a claim read from a rolled-back write), two publishers of a
    partition (G4), an inbox effect taken twice or a writer's transaction retried into a
    second business effect, a relay or inbox worker that stays unhealthy or crashed after the
    primary moved, or a traceback in their logs."""
    replica_set = await asyncio.to_thread(
        mongo_replica_set_factory, transaction_lifetime_limit_seconds=10
    )
    url = replica_set.url("shop")
    await migrate_mongodb_database(url)
    async with FailoverRun(
        url, kafka_bootstrap, tmp_path, rate=150.0, concurrent_writers=16
    ) as run:
        for scenario in MONGODB_FAULTS.values():
            await scenario(run, replica_set)
        report = await run.finish()
    print(f"\n{report}")
    report.assert_ok(max_gap=MAX_GAP)
    # Each writer's transaction incremented its key's count once (run_transaction retried
    # aborted transactions and unknown commits, never a committed one).
    counts = await business_counts(url)
    expected = {_key(run, entity): len(ids) for entity, ids in run.writers.committed.items() if ids}
    assert counts == expected, "a business effect applied twice (or lost)"


def _key(run: FailoverRun, entity: str) -> str:
    return str(Payment(topic=run.topic, entity=entity, seq=0).key)


async def test_a_connection_opened_during_a_failover_is_dropped_not_kept(
    mongo_replica_set_factory: Callable[..., EmbeddedMongoReplicaSet],
) -> None:
    """pymongo marks a connection whose handshake found its member neither primary nor
    secondary (a step-down, an election, a start) as not supporting sessions, keeps it, and
    fails every transaction or snapshot read on it with ``ConfigurationError: Sessions are not
    supported``, for as long as it lives; an inbox worker exited on that in a rolling restart.
    Here a member in maintenance (RECOVERING) makes such a connection. Would catch the error
    treated as fatal (not retriable), or the connection kept, so that the member, a secondary
    again, still fails the same way."""
    replica_set = await asyncio.to_thread(mongo_replica_set_factory)
    member = replica_set.members[2]
    client = make_client(
        f"mongodb://{member.address}/?directConnection=true&readPreference=secondaryPreferred",
        connect_timeout=5,
        app_name="stale-connection",
    )

    async def read_in_a_session() -> object:
        async with client.start_session() as session:
            return await guarded(
                client.shop.docs.find_one({}, session=session), StorageUnavailableError
            )

    try:
        await asyncio.to_thread(_maintenance, member, True)
        with pytest.raises(StorageUnavailableError, match="Sessions are not supported"):
            await read_in_a_session()
        await asyncio.to_thread(_maintenance, member, False)
        await asyncio.to_thread(replica_set.wait_for_members)
        assert await read_in_a_session() is None
    finally:
        await client.close()


def _maintenance(member: ReplicaSetMember, on: bool) -> None:
    with member.client() as client:
        client.admin.command("replSetMaintenance", on)


async def test_a_live_relay_is_not_taken_for_dead_after_its_primary_restarted(
    mongo_factory: Callable[..., EmbeddedMongo],
) -> None:
    """A relay is reported departed when its heartbeat is stale and the primary lists none of
    its connections. After a restart (a SIGKILLed primary back, or elected again) every relay's
    presence client must reconnect within the reconnect grace; with pymongo's default 10 s
    monitor interval an idle presence client came back only after it, and a live relay whose
    heartbeats had paused in the outage was removed from the group as dead. Would catch that."""
    server = await asyncio.to_thread(mongo_factory)
    url = server.url("shop")
    clients = [make_client(url, connect_timeout=10, app_name=name) for name in ("a", "b")]
    a, b = (
        MongoPresence(url, client.shop, app_name="relay", connect_timeout=10) for client in clients
    )
    try:
        await b.announce("group", "b")
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)
        restarted = time.monotonic()
        await a.announce("group", "a")  # a relay that (re)joins right after the restart
        # b's process lives, its presence client open; it beats no more (frozen, or its beats
        # failed through the outage): it must not look dead while its connections are back.

        async def reports_nothing() -> None:
            await a.announce("group", "a")
            assert await a.departed("group", "a") == [], "a live relay was reported departed"

        await holds_for(RECONNECT_GRACE + 4 - (time.monotonic() - restarted), reports_nothing)
    finally:
        await a.close()
        await b.close()
        for client in clients:
            await client.close()
