"""Inbox transactions that fit the database's time limit (G8, issue #26 item 2), against real
PostgreSQL (``transaction_timeout``), MongoDB (``transactionLifetimeLimitSeconds``) and Apache
Kafka. On main before this, a batch whose transaction the database aborted for running too long
was run again as it was, forever (limit 2 s, a 4 s handler: 18 attempts, 0 effects, 0 dead
letters, health red). Workers run as processes (``inbox_slow_app``), as in production."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from outboxkit.schemas import partition_for_key
from tests.integration.conftest import MakeTopic, migrate_mongodb_database
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    read_all,
    wait_caught_up,
    wait_effects,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: The databases' transaction time limit in these tests, in seconds.
LIMIT = 2
SLOW_APP = ("-m", "outboxkit", "inbox", "tests.integration.inbox_slow_app:inbox")


@pytest.fixture(params=["postgresql", "mongodb"])
def limited_db(request: pytest.FixtureRequest) -> str:
    """A migrated database whose transactions the server aborts after 2 s: PostgreSQL's
    ``transaction_timeout`` set on the database, a mongod started with that
    ``transactionLifetimeLimitSeconds``."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        with psycopg.connect(url, autocommit=True) as conn:
            name = conn.info.dbname
            conn.execute(f"ALTER DATABASE \"{name}\" SET transaction_timeout = '{LIMIT}s'")
        return url
    mongo = request.getfixturevalue("mongo_factory")(transaction_lifetime_limit_seconds=LIMIT)
    url = str(mongo.url("limits"))
    asyncio.run(migrate_mongodb_database(url))
    return url


def _entities_on(partition: int, partitions: int, prefix: str, count: int) -> list[str]:
    names = (f"{prefix}{i}" for i in range(1000))
    return [n for n in names if partition_for_key(n, partitions) == partition][:count]


@pytest.mark.parametrize("batch", ["0", "1"], ids=["handler", "batch handler"])
async def test_a_record_whose_handler_outlives_the_limit_is_dead_lettered_and_the_rest_flows(
    limited_db: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, batch: str
) -> None:
    """Partition 0 holds a record whose handler takes 3 s, past the 2 s limit, between records
    that take none; partition 1 holds quick ones only. The aborted batch is split down to the
    slow record, which counts as a failing handler (2 attempts) and is dead-lettered with the
    reason; every other record takes effect once — those of partition 1 and the one before the
    slow record while it is still being tried. Catches: a batch retried as it is after the
    database aborted it (nothing moves, nothing is dead-lettered), a split that loses or repeats
    records, a slow record retried forever. With a batch handler, whose call the time budget
    cannot cut, the call that holds the slow record outlives the limit and is split the same
    way."""
    url = limited_db
    topic = await make_topic("payments", partitions=2)
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(url)
    slow_key = _entities_on(0, 2, f"sleep:{LIMIT + 1}:", 1)[0]
    before, *after = (
        Payment(topic=topic, entity=e, seq=i) for i, e in enumerate(_entities_on(0, 2, "a", 3))
    )
    slow = Payment(topic=topic, entity=slow_key, seq=99)
    others = [
        Payment(topic=topic, entity=e, seq=10 + i) for i, e in enumerate(_entities_on(1, 2, "b", 5))
    ]
    await produce(kafka_bootstrap, [before, slow, *after, *others])
    env = inbox_env(
        url, kafka_bootstrap, topic, OUTBOXKIT_HANDLER_ATTEMPTS="2", TEST_BATCH_HANDLER=batch
    )
    worker = InboxProcess(tmp_path, env, SLOW_APP).start()
    try:
        wanted = {e.id for e in [before, *others]}
        await wait_effects(
            url, lambda found: wanted <= {e for e, _, _ in found}, within=60, what="the others"
        )
        assert await read_all(kafka_bootstrap, dlq) == [], "the others went first"
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 2, within=90, what="all")
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    found = sorted(seq for _, _, seq in await effects(url))
    assert found == sorted(e.seq for e in [before, *after, *others]), "each once, not the slow"
    [letter] = await read_all(kafka_bootstrap, dlq)
    h = dict(letter.headers)
    assert h["outboxkit-error-reason"] == b"handler_failed"
    assert h["ce_id"] == str(slow.id).encode()
    assert b"outlived" in h["outboxkit-error-message"], h["outboxkit-error-message"]
    assert "splitting the batch" in worker.log()


async def test_a_batch_stops_growing_before_the_limit(
    limited_db: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Eight records whose handlers take 0.4 s each (3.2 s in all, past the 2 s limit) on one
    partition: each transaction stops taking records once its handlers used a quarter of the
    limit, so none is aborted, none is split and every record takes effect once. Catches
    batches sized by count only (the whole batch aborted, retried forever before the split;
    split and retried after it)."""
    url = limited_db
    topic = await make_topic("payments")
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(url)
    events = [Payment(topic=topic, entity=f"sleep:0.4:{i}", seq=i) for i in range(8)]
    await produce(kafka_bootstrap, events)
    worker = InboxProcess(tmp_path, inbox_env(url, kafka_bootstrap, topic), SLOW_APP).start()
    try:
        await wait_caught_up(kafka_bootstrap, group_of(topic), topic, 1, within=60, what="all")
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    assert sorted(seq for _, _, seq in await effects(url)) == list(range(8))
    assert await read_all(kafka_bootstrap, dlq) == []
    assert "splitting the batch" not in worker.log(), "no transaction was aborted"
