"""The inbox under hostile input, against real PostgreSQL and Apache Kafka (issue #16): records
the Kafka client cannot read, dead letters that do not fit, and health that tells the truth.
Workers run as processes, as in production."""

from __future__ import annotations

from pathlib import Path

import pytest

from outboxkit.schemas import encode
from tests.helpers import wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    caught_up,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    produce_raw_batch,
    read_all,
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
    and handles the records around it, including the rest of the same batch."""
    topic = await make_topic("payments")
    dlq = await make_topic(name=f"{topic}.dlq")
    await create_effects_table(pg_url)
    before, poisoned, batch_mate, after = (
        Payment(topic=topic, entity="e", seq=i) for i in range(4)
    )
    await produce(kafka_bootstrap, [before])
    key, value, headers = _raw(poisoned)
    await produce_raw_batch(
        kafka_bootstrap,
        topic,
        [(key, value, [*headers, (b"bad\xff\xfename", b"x")]), _raw(batch_mate)],
    )
    await produce(kafka_bootstrap, [after])
    worker = InboxProcess(tmp_path, inbox_env(pg_url, kafka_bootstrap, topic)).start()
    try:
        await wait_for(
            lambda: caught_up(kafka_bootstrap, group_of(topic), topic, 1), within=60, what="all"
        )
        assert worker.alive(), worker.log()
    finally:
        worker.kill()
    assert sorted(seq for _, _, seq in await effects(pg_url)) == [0, 2, 3]
    [letter] = await read_all(kafka_bootstrap, dlq)
    h = dict(letter.headers)
    assert h["outboxkit-error-reason"] == b"unreadable_record"
    assert h["outboxkit-source-offset"] == b"1"
    assert b"UnicodeDecodeError" in h["outboxkit-error-message"]
    assert letter.value == value, "the original value is recovered"
    assert "unreadable record" in worker.log()
