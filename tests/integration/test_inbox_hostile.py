"""The inbox under hostile input, against real PostgreSQL and Apache Kafka (issue #16): records
the Kafka client cannot read, dead letters that do not fit, and health that tells the truth.
Workers run as processes, as in production."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from outboxkit.embedded._process import free_port
from outboxkit.schemas import encode, partition_for_key
from tests.helpers import http_client, run_cli, wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    produce_raw_batch,
    read_all,
    wait_caught_up,
    wait_effects,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _raw(event: Payment) -> tuple[bytes, bytes, list[tuple[bytes, bytes | None]]]:
    wire = encode(event, source="urn:test")
    return wire.key, wire.value, [(name.encode(), value) for name, value in wire.headers]


async def test_a_record_aiokafka_cannot_read_is_dead_lettered_and_skipped(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A header *name* that is not UTF-8 makes aiokafka's record iterator raise
    UnicodeDecodeError (the batch is valid on the wire). The worker must neither crash nor
    re-fetch it forever: it dead-letters what it can recover of that record, with its position,
    and handles the records around it — before it, after it in the same batch, after it in the
    partition, and the other partitions' records that aiokafka had fetched with it."""
    topic = await make_topic("payments", partitions=3)
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(pg_url)
    entities = {
        p: next(f"e{i}" for i in range(50) if partition_for_key(f"e{i}", 3) == p) for p in (0, 1, 2)
    }
    before, poisoned, batch_mate, after = (
        Payment(topic=topic, entity=entities[0], seq=i) for i in range(4)
    )
    others = [
        Payment(topic=topic, entity=entities[p], seq=10 * p + i) for p in (1, 2) for i in range(5)
    ]
    await produce(kafka_bootstrap, [before, *others])
    key, value, headers = _raw(poisoned)
    await produce_raw_batch(
        kafka_bootstrap,
        topic,
        [(key, value, [*headers, (b"bad\xff\xfename", b"x")]), _raw(batch_mate)],
    )
    await produce(kafka_bootstrap, [after])
    worker = InboxProcess(tmp_path, inbox_env(pg_url, kafka_bootstrap, topic)).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 3, within=60, what="all")
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    expected = sorted([0, 2, 3, *(e.seq for e in others)])
    assert sorted(seq for _, _, seq in await effects(pg_url)) == expected, "each once"
    [letter] = await read_all(kafka_bootstrap, dlq)
    h = dict(letter.headers)
    assert h["outboxkit-error-reason"] == b"unreadable_record"
    assert (h["outboxkit-source-partition"], h["outboxkit-source-offset"]) == (b"0", b"1")
    assert b"UnicodeDecodeError" in h["outboxkit-error-message"]
    assert letter.value == value, "the original value is recovered"
    assert "unreadable record" in worker.log()


async def test_a_bad_record_too_large_to_dead_letter_whole_is_cut_to_fit(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A non-JSON value of 1,048,400 bytes fits the broker's default limit, but its dead-letter
    copy (with the error headers) does not fit the producer's: the worker used to retry that
    send forever, the partition stuck and the worker "healthy". It now dead-letters a copy cut to
    fit, flagged as truncated, pointing at the original, and goes on."""
    topic = await make_topic("payments")
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(pg_url)
    huge = b"\xff" + b"x" * (1_048_400 - 1)
    after = Payment(topic=topic, entity="e", seq=1)
    await produce(kafka_bootstrap, [], raw=[(topic, huge, [])])
    await produce(kafka_bootstrap, [after])
    worker = InboxProcess(tmp_path, inbox_env(pg_url, kafka_bootstrap, topic)).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 1, within=60, what="all")
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    assert [seq for _, _, seq in await effects(pg_url)] == [1]
    [letter] = await read_all(kafka_bootstrap, dlq)
    h = dict(letter.headers)
    assert h["outboxkit-error-reason"] == b"too_large"
    assert h["outboxkit-truncated"] == b"true"
    assert int(h["outboxkit-original-size"]) > 1_048_400
    assert (h["outboxkit-source-topic"], h["outboxkit-source-offset"]) == (topic.encode(), b"0")
    assert letter.value is not None
    assert huge.startswith(letter.value), "a prefix of the original value"
    assert len(letter.value) > 900_000


async def test_a_dead_letter_topic_that_refuses_even_a_pointer_parks_only_its_partition(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A permanent producer error (here: the dead-letter topic's own size limit is below even a
    pointer to the original) is never retried in a loop: the record's partition is parked —
    logged, counted, named in the health endpoint and in ``outboxkit inbox status`` — and the
    worker keeps consuming the other partitions."""
    topic = await make_topic("payments", partitions=2)
    await make_topic(name=f"{topic}.dlq", config={"max.message.bytes": "64"})
    await create_effects_table(pg_url)
    on = {p: [f"e{i}" for i in range(40) if partition_for_key(f"e{i}", 2) == p][:3] for p in (0, 1)}
    await _produce_to(kafka_bootstrap, topic, 0, b"not json")
    stuck = [Payment(topic=topic, entity=e, seq=i) for i, e in enumerate(on[0])]
    flowing = [Payment(topic=topic, entity=e, seq=10 + i) for i, e in enumerate(on[1])]
    await produce(kafka_bootstrap, [*stuck, *flowing])
    port = free_port()
    env = inbox_env(pg_url, kafka_bootstrap, topic, OUTBOXKIT_HTTP_PORT=str(port))
    worker = InboxProcess(tmp_path, env).start()
    try:
        await wait_effects(pg_url, lambda found: len(found) >= len(flowing), within=60, what="p1")
        health = await _health(port, until=lambda h: bool(h.get("partitions")))
        [parked] = health["partitions"]
        assert (parked["partition"], parked["offset"]) == (f"{topic}/0", 0)
        assert "MessageSizeTooLarge" in parked["parked"] or "TooLarge" in parked["parked"]
        status = await _status(kafka_bootstrap, topic, until_failing=True)
        assert f"PARKED  {topic}/0 offset 0" in status.stdout, status.stdout
        assert f"ok      {topic}/1" in status.stdout, status.stdout
        assert worker.alive(), worker.log()
        assert "the partition is parked" in worker.log()
        assert worker.log().count("cannot dead-letter the record") == 1, "no retry loop"
    finally:
        worker.kill()
    assert sorted(seq for _, _, seq in await effects(pg_url)) == [e.seq for e in flowing]


async def test_a_partition_that_makes_no_progress_makes_the_worker_unhealthy(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A handler that never returns (a hung dependency) holds its partition while records
    wait. The worker used to stay "healthy"; after OUTBOXKIT_STALL_AFTER it is not, and both
    its health endpoint and ``outboxkit inbox status`` name the partition and its offset."""
    topic = await make_topic("payments")
    await make_topic(name=f"{topic}.dlq")
    await create_effects_table(pg_url)
    events = [Payment(topic=topic, entity="ok", seq=0), Payment(topic=topic, entity="hangs", seq=1)]
    await produce(kafka_bootstrap, [*events, Payment(topic=topic, entity="ok", seq=2)])
    port = free_port()
    env = inbox_env(
        pg_url,
        kafka_bootstrap,
        topic,
        OUTBOXKIT_HTTP_PORT=str(port),
        OUTBOXKIT_STALL_AFTER="2",
        OUTBOXKIT_TRANSACTION_BATCH="1",
    )
    worker = InboxProcess(tmp_path, env).start()
    try:
        health = await _health(port, until=lambda h: bool(h.get("partitions")))
        [stalled] = health["partitions"]
        assert (stalled["partition"], stalled["offset"], stalled["pending"]) == (f"{topic}/0", 1, 2)
        assert stalled["seconds_since_progress"] >= 2
        status = await _status(kafka_bootstrap, topic, until_failing=True, stall_after="2")
        assert f"STALLED {topic}/0 offset 1 pending 2" in status.stdout, status.stdout
        assert worker.alive(), worker.log()
    finally:
        worker.kill()


async def _produce_to(bootstrap: str, topic: str, partition: int, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"raw", partition=partition)
    finally:
        await producer.stop()


async def _health(port: int, *, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The worker's /healthz once ``until`` holds for it (a 503 while it does)."""
    seen: dict[str, Any] = {}

    async def check() -> bool:
        nonlocal seen
        try:
            async with http_client() as client:
                response = await client.get(f"http://127.0.0.1:{port}/healthz")
        except httpx.HTTPError:
            return False
        seen = response.json()
        return until(seen) and response.status_code == 503

    await wait_for(check, within=60, what="the health endpoint to tell")
    return seen


async def _status(
    bootstrap: str, topic: str, *, until_failing: bool, stall_after: str = "60"
) -> subprocess.CompletedProcess[str]:
    """``outboxkit inbox status`` of the test inbox (named after its topic)."""
    result: subprocess.CompletedProcess[str] | None = None

    def status() -> bool:
        nonlocal result
        result = run_cli(
            "inbox",
            "status",
            topic,
            "--topics",
            topic,
            "--stall-after",
            stall_after,
            env={"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        )
        return (result.returncode == 1) == until_failing

    await wait_for(lambda: asyncio.to_thread(status), within=60, interval=1, what="the status")
    assert result is not None
    return result
