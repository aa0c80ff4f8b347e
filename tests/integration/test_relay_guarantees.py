"""The relay's guarantees, proven against real PostgreSQL, MongoDB and Apache Kafka servers.

Writers write each entity's events in series (each with a business row in the same
transaction) while relays run as separate processes that the tests kill, freeze, add and
remove. Afterwards the topic is read back with read_committed and checked: every committed
event is there (G1) and per entity the sequence numbers never go down (G2). Each test runs on
every real database backend (``db_url``: PostgreSQL and MongoDB).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.backends import backend_for
from outboxkit.core.settings import ConnectionSettings
from outboxkit.embedded import KafkaCluster
from outboxkit.embedded._process import free_port
from outboxkit.relay import PostgresOutbox
from tests.helpers import http_client, wait_for
from tests.integration.conftest import MakeTopic, RestartableDatabase
from tests.integration.relay_harness import (
    Big,
    RelayProcess,
    Step,
    Writers,
    check_guarantees,
    read_topic,
    register_topic,
    relay_env,
    relays,
    wait_pending,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def _drained(url: str, writers: Writers, bootstrap: str, topic: str, partitions: int) -> str:
    await wait_pending(url, within=60)
    return check_guarantees(writers, await read_topic(bootstrap, topic, partitions))


def _owns(relay: RelayProcess) -> bool:
    return "partitions assigned" in relay.log()


async def _written_more(writers: Writers, count: int) -> None:
    target = writers.total + count
    await wait_for(lambda: writers.total >= target, within=30, what=f"{count} more events")


async def test_publishes_everything_in_order(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic("steps", partitions=3)
    await register_topic(db_url, topic, 3)
    writers = Writers(db_url, topic, entities=12)
    port = free_port()
    env = relay_env(db_url, kafka_bootstrap, topic, OUTBOXKIT_HTTP_PORT=str(port))
    with relays(tmp_path, env):
        writers.start()
        await wait_for(lambda: writers.total >= 600, within=60, what="600 events written")
        await writers.stop()
        summary = await _drained(db_url, writers, kafka_bootstrap, topic, 3)
        # The worker's probe and metrics.
        async with http_client(base_url=f"http://127.0.0.1:{port}") as http:
            health = await http.get("/healthz")
            assert health.status_code == 200
            assert health.json()["owned"] == [f"{topic}/0", f"{topic}/1", f"{topic}/2"]
            metrics = (await http.get("/metrics")).text
        line = f'outboxkit_relay_published_total{{topic="{topic}"}} '
        [published] = [
            float(m.removeprefix(line)) for m in metrics.splitlines() if m.startswith(line)
        ]
        assert published >= writers.total
        assert "outboxkit_relay_commit_to_ack_seconds_bucket" in metrics
    print(summary)


async def test_late_commit_is_not_skipped(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G3: a transaction that took its outbox id first but commits last is still published."""
    topic = await make_topic("late", partitions=1)
    await register_topic(db_url, topic, 1)
    late = Step(topic=topic, entity="slow", seq=0)
    backend = backend_for(db_url)
    with relays(tmp_path, relay_env(db_url, kafka_bootstrap, topic)):
        async with (
            backend.transactions(source="urn:test", pool_size=1, connect_timeout=5) as tx,
            tx.transaction() as slow,
        ):
            await tx.outbox.add(slow, late)  # first to write, stays uncommitted
            writers = Writers(db_url, topic, entities=4)
            writers.start()
            await wait_for(lambda: writers.total >= 100, within=30, what="later commits")
            await writers.stop()
            await wait_pending(db_url, within=30, what="later events published")
        # the late transaction committed here
        await wait_pending(db_url, within=30, what="the late event published")
        published = await read_topic(kafka_bootstrap, topic, 1)
    ids = [event_id for records in published.values() for _, event_id in records]
    assert ids[-1] == late.id, "the late event comes after the ones committed before it"
    check_guarantees(writers, published)


async def test_relay_sigkill_and_restart(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G1/G2 across SIGKILL: a killed relay's in-flight batch is republished by the next one."""
    topic = await make_topic("killed", partitions=3)
    await register_topic(db_url, topic, 3)
    writers = Writers(db_url, topic, entities=10)
    env = relay_env(db_url, kafka_bootstrap, topic)
    writers.start()
    for round_ in range(4):
        with relays(tmp_path, env) as (relay,):
            await wait_for(lambda r=relay: _owns(r), within=30, what="ownership")
            # Kill it at a different point of its work each round.
            await _written_more(writers, 100 + round_ * 150)
            relay.kill()
    with relays(tmp_path, env):
        await writers.stop()
        summary = await _drained(db_url, writers, kafka_bootstrap, topic, 3)
    print(summary)


async def test_relays_join_and_leave(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G4: 1 → 3 → 2 relays while events flow; partitions move, order and no loss hold."""
    topic = await make_topic("scaled", partitions=6)
    await register_topic(db_url, topic, 6)
    writers = Writers(db_url, topic, entities=16)
    env = relay_env(db_url, kafka_bootstrap, topic)
    writers.start()
    with relays(tmp_path, env, count=1) as first:
        await wait_for(lambda: _owns(first[0]), within=30, what="ownership")
        await _written_more(writers, 200)
        with relays(tmp_path, env, count=2) as more:
            await wait_for(lambda: all(map(_owns, more)), within=30, what="a rebalance to 3")
            await _written_more(writers, 300)
            assert more[0].terminate() == 0, more[0].log()  # leaves cleanly on SIGTERM
            await _written_more(writers, 300)
            await writers.stop()
            summary = await _drained(db_url, writers, kafka_bootstrap, topic, 6)
        assert first[0].process is not None
        assert first[0].process.poll() is None
    print(summary)


async def test_frozen_relay_is_fenced(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G4: a relay frozen (SIGSTOP) past its session timeout loses its partitions; when it
    wakes (SIGCONT) its transactional producer is fenced, so it cannot reorder a key."""
    topic = await make_topic("frozen", partitions=2)
    await register_topic(db_url, topic, 2)
    writers = Writers(db_url, topic, entities=8)
    env = relay_env(db_url, kafka_bootstrap, topic)
    writers.start()
    with relays(tmp_path, env) as (zombie,):
        await wait_for(lambda: _owns(zombie), within=30, what="ownership")
        await _written_more(writers, 200)
        # Some committed events have left the outbox: it publishes.
        await wait_pending(
            db_url, lambda pending: pending < writers.total - 50, within=30, what="it publishing"
        )
        zombie.signal(signal.SIGSTOP)
        with relays(tmp_path, env) as (successor,):
            # It gets the partitions only once the frozen one's session timed out.
            await wait_for(lambda: _owns(successor), within=30, what="the takeover")
            await _written_more(writers, 200)
            before = len(zombie.log())
            zombie.signal(signal.SIGCONT)
            # It notices by Kafka's fencing or revocation, or first by its own membership
            # check (it heard nothing from the coordinator while frozen): all three stop it.
            noticed = ("fenced", "partitions revoked", "no answer from the group coordinator")

            def woke_and_noticed() -> bool:
                since = zombie.log()[before:]  # one read of the log per poll
                return any(line in since for line in noticed)

            await wait_for(
                woke_and_noticed,
                within=30,
                what="the zombie to notice",
            )
            await _written_more(writers, 200)
            await writers.stop()
            summary = await _drained(db_url, writers, kafka_bootstrap, topic, 2)
            assert successor.process is not None
            assert successor.process.poll() is None
    # Being fenced is expected: at most one warning line for its block, no traceback.
    log = zombie.log()
    assert "Traceback" not in log
    assert "never retrieved" not in log
    assert log.count("partitions fenced") <= 1
    print(summary)


async def test_sigterm_drains_and_exits_zero(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic("drain", partitions=2)
    await register_topic(db_url, topic, 2)
    writers = Writers(db_url, topic, entities=6)
    with relays(tmp_path, relay_env(db_url, kafka_bootstrap, topic)) as (relay,):
        writers.start()
        await wait_for(lambda: "partitions assigned" in relay.log(), within=30, what="ownership")
        await wait_for(lambda: writers.total >= 200, within=30, what="events written")
        started = time.monotonic()
        assert relay.terminate() == 0, relay.log()
        assert time.monotonic() - started < 10
        assert "relay stopped" in relay.log()
        # Every side task ended when cancelled: none lost its cancellation in a driver call
        # (core/waiting.py; before, 2 of 20 such stops on MongoDB waited out the 5 s grace).
        assert "did not stop when cancelled" not in relay.log()
    with relays(tmp_path, relay_env(db_url, kafka_bootstrap, topic)):
        await writers.stop()
        summary = await _drained(db_url, writers, kafka_bootstrap, topic, 2)
    print(summary)


async def test_broker_restart(
    db_url: str, kafka_factory: Callable[[int], KafkaCluster], tmp_path: Path
) -> None:
    """G1/G2 across a broker stop and start (same ports and data) while writers write."""
    cluster = await asyncio.to_thread(kafka_factory, 1)
    bootstrap = cluster.bootstrap_servers
    topic = "restarted"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 3, 1)])
    await admin.close()
    await register_topic(db_url, topic, 3)
    writers = Writers(db_url, topic, entities=8)
    with relays(tmp_path, relay_env(db_url, bootstrap, topic)) as (relay,):
        writers.start()
        await wait_for(lambda: "partitions assigned" in relay.log(), within=30, what="ownership")
        await wait_for(lambda: writers.total >= 300, within=30, what="events written")
        await asyncio.to_thread(cluster.nodes[0].stop)
        await wait_for(lambda: writers.total >= 900, within=30, what="writes while Kafka is down")
        await asyncio.to_thread(cluster.nodes[0].start)
        await writers.stop()
        summary = await _drained(db_url, writers, bootstrap, topic, 3)
        assert relay.process is not None
        assert relay.process.poll() is None, relay.log()
    print(summary)


async def test_database_connections_killed_and_server_restarted(
    restartable_db: RestartableDatabase,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    """G1/G2 when the relay's connections are terminated (PostgreSQL) and the database server
    crashes (SIGKILL) and restarts; G5's fallback: the listener or change stream reconnects and
    everything is read again."""
    url, server = await restartable_db()
    topic = await make_topic("dbrestart", partitions=3)
    await register_topic(url, topic, 3)
    writers = Writers(url, topic, entities=8)
    with relays(tmp_path, relay_env(url, kafka_bootstrap, topic)) as (relay,):
        writers.start()
        await wait_for(lambda: "partitions assigned" in relay.log(), within=30, what="ownership")
        await wait_for(lambda: writers.total >= 200, within=30, what="events written")
        if url.startswith("postgresql"):
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND datname = current_database()"
                )
            await wait_for(lambda: writers.total >= 400, within=30, what="writes after the kill")
        await asyncio.to_thread(server.restart, "immediate")
        await wait_for(lambda: writers.total >= 700, within=60, what="writes after the crash")
        await writers.stop()
        summary = await _drained(url, writers, kafka_bootstrap, topic, 3)
        assert relay.process is not None
        assert relay.process.poll() is None, relay.log()
    print(summary)


@pytest.mark.parametrize("refused_by", ["producer", "broker"])
async def test_record_the_broker_refuses_is_parked_and_blocks_only_its_key(
    refused_by: str, db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G8 (outbox side): an oversize record is retried with backoff, then parked as failed with
    the error; later events of its key wait behind it, other keys flow; `retry`/`skip` release it.
    ``producer``: over the producer's max_request_size, refused before sending. ``broker``:
    over the topic's max.message.bytes, so the broker refuses the whole record batch of the
    partition it shares with a healthy record; the relay then sends one record per record batch
    to find which record it was (``PublishOutcome.refused_batch``)."""
    if refused_by == "producer":
        topic = await make_topic("poison", partitions=1)
        blob = "x" * 2_000_000
    else:
        topic = await make_topic("poison", partitions=1, config={"max.message.bytes": "20000"})
        blob = "x" * 50_000
    await register_topic(db_url, topic, 1)
    poison = Big(topic=topic, entity="poisoned", blob=blob)
    behind = Step(topic=topic, entity="poisoned", seq=1)
    other = Step(topic=topic, entity="healthy", seq=0)
    backend = backend_for(db_url)
    async with backend.transactions(source="urn:test", pool_size=1, connect_timeout=5) as tx:
        # Writers refuse records over the producer's limit since #26 (test_limits.py); such a
        # record still reaches the relay from a writer given a higher limit, or written before.
        tx.outbox.max_record_bytes = 3_000_000  # type: ignore[attr-defined]
        await tx.run(lambda t: tx.outbox.add_many(t, [poison, behind, other]))
    env = relay_env(db_url, kafka_bootstrap, topic, OUTBOXKIT_MAX_ATTEMPTS="3")
    settings = ConnectionSettings(database_url=db_url)
    async with backend.outbox_operations(settings) as operations:
        with relays(tmp_path, env) as (relay,):

            async def parked() -> bool:
                return bool(await operations.list_records("failed", 10))

            await wait_for(parked, within=60, what="the oversize record parked")
            [failed] = await operations.list_records("failed", 10)
            assert failed.event_id == poison.id
            assert failed.attempts == 3
            assert failed.last_error is not None
            assert "MessageSizeTooLargeError" in failed.last_error

            async def only_its_key_waits() -> bool:
                waiting = await operations.list_records("pending", 10)
                return [r.event_id for r in waiting] == [behind.id]

            # A refusal by the broker dooms its Kafka transaction: the healthy record of the
            # same transaction is published once the poison is parked, not before.
            await wait_for(only_its_key_waits, within=30, what="other keys flowing")
            # Logged just after the park commits: the relay may not have written it yet.
            await wait_for(
                lambda: "record parked as failed" in relay.log(), within=10, what="the park logged"
            )

            assert await operations.skip_failed([poison.id]) == 1
            await wait_pending(db_url, within=30, what="the key released")
            published = await read_topic(kafka_bootstrap, topic, 1)
    ids = [event_id for _, event_id in published[0]]
    assert ids == [other.id, behind.id]


async def test_writers_through_pgbouncer_still_wake_the_relay(
    pg_url: str, pgbouncer_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G5 with a pooler: writers go through PgBouncer in transaction mode, the relay LISTENs on
    its own direct session. With the fallback sweep set to 60 s, only wake-ups can deliver the
    events within the deadline."""
    topic = await make_topic("pooled", partitions=2)
    await register_topic(pg_url, topic, 2)
    outbox = PostgresOutbox(source="urn:test")
    env = relay_env(pg_url, kafka_bootstrap, topic, OUTBOXKIT_SWEEP_INTERVAL="60")
    with relays(tmp_path, env) as (relay,):
        await wait_for(lambda: "partitions assigned" in relay.log(), within=30, what="ownership")
        await wait_pending(pg_url, within=30, what="the relay to go idle")
        # PgBouncer 1.18 cannot carry server-side prepared statements in transaction mode.
        async with await psycopg.AsyncConnection.connect(
            pgbouncer_url, prepare_threshold=None
        ) as conn:
            for seq in range(20):
                started = time.monotonic()
                async with conn.transaction():
                    await outbox.add(conn, Step(topic=topic, entity="pooled", seq=seq))
                # Milliseconds when woken; 15 s leaves room for a loaded CI and is still far
                # below the 60 s sweep.
                await wait_pending(pg_url, within=15, what="a woken relay")
                assert time.monotonic() - started < 15
