"""The inbox's guarantees against real PostgreSQL, MongoDB and Apache Kafka: effects once (G6),
bad input contained (G8), bounded dedupe storage (G7). Workers run as processes the tests kill.
Each test runs on every real database backend (``db_url``)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent
from prometheus_client.parser import text_string_to_metric_families

from outboxkit.backends import backend_for
from outboxkit.core.settings import ConnectionSettings
from outboxkit.embedded._process import free_port
from outboxkit.schemas import encode
from outboxkit.schemas.foreign import foreign_event_id
from tests.helpers import http_client, wait_for
from tests.integration.conftest import MakeTopic, RestartableDatabase
from tests.integration.inbox_app import Payment, Refund
from tests.integration.inbox_harness import (
    CRASHING,
    GroupProgress,
    InboxProcess,
    InboxTables,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    read_all,
    wait_caught_up,
    wait_effects,
)
from tests.integration.relay_harness import register_topic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _once_each(found: list[tuple[object, str, int]], expected: list[Payment]) -> None:
    counts = Counter(event_id for event_id, _, _ in found)
    assert set(counts) == {e.id for e in expected}, "every event took effect"
    assert max(counts.values()) == 1, f"an event took effect twice: {counts.most_common(3)}"


#: The test app's Payment handler: per event, or a batch handler (TEST_BATCH_HANDLER).
HANDLER_KINDS = pytest.mark.parametrize("batch", ["0", "1"], ids=["handler", "batch handler"])


async def test_duplicates_from_any_source_take_effect_once(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic("payments", partitions=3)
    await make_topic(name=f"{topic}.dlq")  # the inbox refuses to start without it
    await create_effects_table(db_url)
    events = [Payment(topic=topic, entity=f"e{i % 7}", seq=i) for i in range(60)]
    # A relay re-send (everything twice), then a replay of some, later.
    await produce(kafka_bootstrap, [*events, *events])
    worker = InboxProcess(tmp_path, inbox_env(db_url, kafka_bootstrap, topic)).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 3, within=60, what="catch up")
        await produce(kafka_bootstrap, events[:10])
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 3, within=30, what="replay")
        _once_each(await effects(db_url), events)
        assert worker.terminate() == 0, worker.log()
        assert "inbox stopped" in worker.log()
    finally:
        worker.kill()


@HANDLER_KINDS
async def test_bad_input_is_dead_lettered_and_the_consumer_goes_on(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, batch: str
) -> None:
    topic = await make_topic("payments")
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(db_url)
    good = [Payment(topic=topic, entity="ok", seq=i) for i in range(3)]
    failing = Payment(topic=topic, entity="always-fails", seq=0)
    valid = encode(good[0], source="urn:test")
    headers = dict(valid.headers)
    unknown_type = [(n, b"test.nobody" if n == "ce_type" else v) for n, v in valid.headers]
    invalid_payload = json.dumps({"entity": "x", "seq": 1, "amount": -5}).encode()
    await produce(
        kafka_bootstrap,
        [],
        raw=[
            (topic, b"\xff\x00 garbage", []),
            (topic, valid.value, unknown_type),
            (topic, invalid_payload, list(valid.headers)),
        ],
    )
    await produce(kafka_bootstrap, [failing, *good])
    env = inbox_env(db_url, kafka_bootstrap, topic, TEST_BATCH_HANDLER=batch)
    worker = InboxProcess(tmp_path, env).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 1, within=60, what="all")
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    _once_each(await effects(db_url), good)
    letters = await read_all(kafka_bootstrap, dlq)
    reasons = [dict(r.headers)["outboxkit-error-reason"].decode() for r in letters]
    assert reasons == ["missing_header", "unknown_type", "invalid_payload", "handler_failed"]
    garbage, _, invalid, handler = letters
    assert garbage.value == b"\xff\x00 garbage"
    assert invalid.value == invalid_payload
    assert dict(invalid.headers)["ce_id"] == headers["ce_id"]
    h = dict(handler.headers)
    assert h["outboxkit-error-type"] == b"RuntimeError"
    assert b"cannot process always-fails" in h["outboxkit-error-message"]
    assert (h["outboxkit-source-topic"], h["outboxkit-inbox"]) == (topic.encode(), topic.encode())
    assert h["outboxkit-source-offset"] == b"3"


@HANDLER_KINDS
async def test_crash_between_database_commit_and_offset_commit(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, batch: str
) -> None:
    """G6: SIGKILL right after a record's transaction commits and before its offset commit, at
    random records, again and again; each restart redelivers; every event takes effect once
    (with a batch handler too: its run of events commits, or none of it)."""
    topic = await make_topic("payments", partitions=2)
    await make_topic(name=f"{topic}.dlq")  # the inbox refuses to start without it
    await create_effects_table(db_url)
    # Small transactions (7 records) so that there are many commits to crash after; the test
    # app's store SIGKILLs the worker after a commit with probability 0.08: about 5 crashes in
    # the first 400 events (each costs a worker's start, ~3 s).
    env = inbox_env(
        db_url,
        kafka_bootstrap,
        topic,
        TEST_CRASH_AFTER_COMMIT="0.08",
        OUTBOXKIT_TRANSACTION_BATCH="7",
        # Each restart's join waits for the killed member's session to end: 3 s, not 10.
        OUTBOXKIT_SESSION_TIMEOUT="3",
        TEST_BATCH_HANDLER=batch,
    )
    events: list[Payment] = []
    crashes = 0

    async with GroupProgress(kafka_bootstrap) as progress:

        async def done_or_dead(worker: InboxProcess) -> bool:
            return not worker.alive() or await progress.caught_up(group_of(topic), topic, 2)

        # 400 events; the crash is drawn by chance, so while it came fewer than 3 times, 200
        # more (up to four times: a loaded machine once drew only 2 crashes in 800 events).
        for size in (400, 200, 200, 200, 200):
            if crashes >= 3:
                break
            seqs = range(len(events), len(events) + size)
            more = [Payment(topic=topic, entity=f"e{i % 5}", seq=i) for i in seqs]
            events += more
            await produce(kafka_bootstrap, more)
            while not await progress.caught_up(group_of(topic), topic, 2):
                worker = InboxProcess(tmp_path, env, CRASHING).start()
                try:
                    await wait_for(
                        lambda w=worker: done_or_dead(w), within=60, what="a crash or the end"
                    )
                    crashed = not worker.alive()  # died by the test app's SIGKILL
                finally:
                    worker.kill()
                crashes += crashed
                assert crashes < 60, "too many rounds"
    assert crashes >= 3, "the test app crashed the worker too rarely to prove anything"
    _once_each(await effects(db_url), events)
    print(f"{crashes} crashes between database commit and offset commit")


async def test_database_restart_loses_nothing_and_dead_letters_nothing(
    restartable_db: RestartableDatabase,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    url, server = await restartable_db()
    await create_effects_table(url)
    topic = await make_topic("payments", partitions=2)
    await make_topic(name=f"{topic}.dlq")
    first = [Payment(topic=topic, entity=f"e{i % 4}", seq=i) for i in range(100)]
    second = [Payment(topic=topic, entity=f"e{i % 4}", seq=i) for i in range(100, 200)]
    worker = InboxProcess(tmp_path, inbox_env(url, kafka_bootstrap, topic)).start()
    try:
        await produce(kafka_bootstrap, first)
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 2, within=60, what="first")
        await asyncio.to_thread(server.stop, "immediate")
        await produce(kafka_bootstrap, second)  # arrives while the database is down
        await wait_for(lambda: "database unavailable" in worker.log(), within=30, what="a pause")
        await asyncio.to_thread(server.start)
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 2, within=90, what="all")
        assert worker.alive(), worker.log()
        assert "record dead-lettered" not in worker.log()
    finally:
        worker.kill()
    _once_each(await effects(url), first + second)
    assert await read_all(kafka_bootstrap, f"{topic}.dlq") == []


@HANDLER_KINDS
async def test_two_workers_rebalancing_take_each_effect_once(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, batch: str
) -> None:
    topic = await make_topic("payments", partitions=4)
    await make_topic(name=f"{topic}.dlq")  # the inbox refuses to start without it
    await create_effects_table(db_url)
    env = inbox_env(db_url, kafka_bootstrap, topic, TEST_BATCH_HANDLER=batch)
    batches = [
        [Payment(topic=topic, entity=f"e{i % 9}", seq=b * 100 + i) for i in range(100)]
        for b in range(4)
    ]
    one = InboxProcess(tmp_path, env).start()
    # The second worker on uvloop (OUTBOXKIT_EVENT_LOOP): the same guarantees on either loop.
    two = InboxProcess(tmp_path, {**env, "OUTBOXKIT_EVENT_LOOP": "uvloop"})
    try:
        await produce(kafka_bootstrap, batches[0])
        two.start()  # joins: a rebalance while records flow
        await produce(kafka_bootstrap, batches[1])
        await wait_effects(db_url, lambda found: len(found) >= 200, within=60, what="two batches")
        one.kill()  # dies without leaving: its partitions move after the session timeout
        await produce(kafka_bootstrap, batches[2])
        await produce(kafka_bootstrap, batches[3])
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 4, within=90, what="all")
    finally:
        one.kill()
        two.kill()
    _once_each(await effects(db_url), [e for batch in batches for e in batch])


async def test_ttl_cleanup_removes_old_dedupe_rows_while_consuming(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """G7: dedupe rows older than the retention go, in small batches, while the worker runs."""
    topic = await make_topic("payments")
    await make_topic(name=f"{topic}.dlq")  # the inbox refuses to start without it
    await create_effects_table(db_url)
    env = inbox_env(
        db_url,
        kafka_bootstrap,
        topic,
        OUTBOXKIT_INBOX_RETENTION="2",
        OUTBOXKIT_CLEANUP_INTERVAL="0.5",
        OUTBOXKIT_CLEANUP_BATCH="7",
    )
    events = [Payment(topic=topic, entity="e", seq=i) for i in range(50)]
    worker = InboxProcess(tmp_path, env).start()

    try:
        await produce(kafka_bootstrap, events)
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 1, within=60, what="all")
        async with InboxTables(db_url) as tables:
            assert await tables.dedupe_records() > 0

            async def cleaned_up() -> bool:
                return await tables.dedupe_records() == 0

            await wait_for(cleaned_up, within=15, what="cleanup")
        later = [Payment(topic=topic, entity="e", seq=i) for i in range(50, 60)]
        await produce(kafka_bootstrap, later)
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 1, within=30, what="more")
    finally:
        worker.kill()
    _once_each(await effects(db_url), events + later)


async def test_handler_chains_an_outbox_event_once(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """inbox → handler → outbox in one transaction: a redelivered event adds no second row."""
    topic = await make_topic("refunds")
    await make_topic(name=f"{topic}.dlq")  # the inbox refuses to start without it
    await register_topic(db_url, "refunds-issued", 3)
    refunds = [Refund(topic=topic, entity=f"r{i}", seq=i) for i in range(20)]
    await produce(kafka_bootstrap, [*refunds, *refunds])
    worker = InboxProcess(tmp_path, inbox_env(db_url, kafka_bootstrap, topic)).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 1, within=60, what="all")
    finally:
        worker.kill()
    settings = ConnectionSettings(database_url=db_url)
    async with backend_for(db_url).outbox_operations(settings) as operations:
        chained = await operations.list_records("pending", 100)
    assert Counter(r.key for r in chained if r.topic == "refunds-issued") == {
        f"r{i}".encode(): 1 for i in range(20)
    }


async def test_other_producers_cloudevents_take_effect_once(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """What a Go, Java or TypeScript service writes with its CloudEvents SDK (here the official
    SDK for Python): ids that are not UUIDs, no schemaversion, binary and structured content
    mode. Each event is sent in both modes (a producer that changed its mode, a re-send): the
    same source and id is the same event, and takes effect once; a bad one is dead-lettered."""
    topic = await make_topic("payments", partitions=2)
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(db_url)
    source = "urn:go:payments"
    sdk = [
        CloudEvent(
            attributes={
                "type": "test.payment",
                "source": source,
                "id": f"pay-{i}",
                "partitionkey": f"e{i % 3}",
            },
            data={"entity": f"e{i % 3}", "seq": i},
        )
        for i in range(12)
    ]
    first = [
        kafka.to_binary_event(e) if i % 2 else kafka.to_structured_event(e)
        for i, e in enumerate(sdk)
    ]
    again = [
        kafka.to_structured_event(e) if i % 2 else kafka.to_binary_event(e)
        for i, e in enumerate(sdk)
    ]
    too_long = CloudEvent(
        attributes={
            "type": "test.payment",
            "source": source,
            "id": "x" * 300,
            "partitionkey": "e0",
        },
        data={"entity": "e0", "seq": 99},
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        # The first event has no time in either mode (Go's and Java's SDKs set none by
        # default): the record's timestamp stands for it.
        first[0], again[0] = _without_time(first[0]), _without_time(again[0])
        for message in [*first, kafka.to_structured_event(too_long), *again]:
            headers = list(message.headers.items())
            key = message.key.encode() if isinstance(message.key, str) else message.key
            await producer.send(topic, message.value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()
    port = free_port()
    worker = InboxProcess(
        tmp_path, inbox_env(db_url, kafka_bootstrap, topic, OUTBOXKIT_HTTP_PORT=str(port))
    ).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 2, within=60, what="all")
        assert worker.alive(), worker.log()
        async with http_client(timeout=5) as http:
            metrics = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        worker.kill()
    # Each of the 24 records read (not the dead letter) by how it differs from outboxkit's form.
    forms = {
        sample.labels["form"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "outboxkit_inbox_foreign_records_total"
        and sample.labels["inbox"] == topic
        and sample.labels["type"] == "test.payment"
    }
    assert forms == {
        "structured": 12,
        "implied_content_type": 12,  # binary mode without datacontenttype
        "derived_id": 24,
        "assumed_version": 24,
        "record_time": 2,
    }
    counts = Counter(event_id for event_id, _, _ in await effects(db_url))
    assert {str(event_id) for event_id in counts} == {
        foreign_event_id(source, f"pay-{i}") for i in range(12)
    }
    assert max(counts.values()) == 1, f"an event took effect twice: {counts.most_common(3)}"
    letters = await read_all(kafka_bootstrap, dlq)
    assert [dict(r.headers)["outboxkit-error-reason"].decode() for r in letters] == [
        "invalid_header"
    ]


def _without_time(message: kafka.KafkaMessage) -> kafka.KafkaMessage:
    if "ce_time" in message.headers:
        headers = {k: v for k, v in message.headers.items() if k != "ce_time"}
        return kafka.KafkaMessage(headers=headers, key=message.key, value=message.value)
    document = json.loads(message.value)
    del document["time"]
    return kafka.KafkaMessage(message.headers, message.key, json.dumps(document).encode())
