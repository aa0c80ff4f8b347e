"""`outboxkit outbox …`: operators see and repair the outbox from the command line, on every
real database backend (``db_url``)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator

from outboxkit.backends import backend_for
from outboxkit.core.settings import ConnectionSettings
from outboxkit.relay import OutboxStorage, TopicPartition
from tests.helpers import run_cli
from tests.integration.relay_harness import Step, register_topic


async def _write(url: str, *events: Step) -> None:
    backend = backend_for(url)
    async with backend.transactions(source="urn:test", pool_size=1, connect_timeout=5) as tx:
        await tx.run(lambda t: tx.outbox.add_many(t, list(events)))


@contextlib.asynccontextmanager
async def _storage(url: str) -> AsyncIterator[OutboxStorage]:
    async with backend_for(url).outbox_storage(ConnectionSettings(database_url=url)) as storage:
        yield storage


async def test_pending_failed_retry_skip(db_url: str) -> None:
    await register_topic(db_url, "orders", 1)
    bad, good = Step(topic="orders", entity="a", seq=0), Step(topic="orders", entity="b", seq=0)
    await _write(db_url, bad, good)
    env = {"OUTBOXKIT_DATABASE_URL": db_url}

    pending = run_cli("outbox", "pending", "--json", env=env)
    assert pending.returncode == 0, pending.stderr
    [row] = json.loads(pending.stdout)
    assert (row["topic"], row["partition"], row["pending"], row["failed"]) == ("orders", 0, 2, 0)

    async with _storage(db_url) as storage:
        [first, _] = await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
        await storage.record_failure(first, "MessageSizeTooLargeError: too big", give_up=True)

    failed = run_cli("outbox", "failed", env=env)
    # The key as the writer gave it (it was shown as key=b'a', and as "b'a'" in --json).
    assert f"{bad.id} test.step orders/0 key=a attempts=" in failed.stdout
    assert "MessageSizeTooLargeError: too big" in failed.stdout
    [shown] = json.loads(run_cli("outbox", "failed", "--json", env=env).stdout)
    assert (shown["event_id"], shown["key"]) == (str(bad.id), "a")

    assert run_cli("outbox", "retry", str(bad.id), env=env).stdout.strip() == "retrying 1 record(s)"
    async with _storage(db_url) as storage:
        [first, _] = await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
        await storage.record_failure(first, "again", give_up=True)
    skipped = run_cli("outbox", "skip", str(bad.id), "--json", env=env)
    assert json.loads(skipped.stdout) == {"action": "skip_failed", "records": 1}
    assert run_cli("outbox", "failed", env=env).stdout.strip() == "no failed records"


def test_replay_of_an_unknown_event_says_so(db_url: str) -> None:
    missing = uuid.uuid4()
    result = run_cli("outbox", "replay", str(missing), env={"OUTBOXKIT_DATABASE_URL": db_url})
    assert result.returncode == 1
    assert f"no matching record for {missing}" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_event_id_is_a_usage_error(db_url: str) -> None:
    result = run_cli("outbox", "skip", "not-a-uuid", env={"OUTBOXKIT_DATABASE_URL": db_url})
    assert result.returncode == 2
    assert "not an event id" in result.stderr


async def test_replay_republishes_a_kept_record(db_url: str) -> None:
    await register_topic(db_url, "orders", 1)
    event = Step(topic="orders", entity="a", seq=0)
    await _write(db_url, event)
    async with _storage(db_url) as storage:
        [record] = await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
        await storage.settle_and_claim([], 10, published=[record], keep=True)
        assert await storage.settle_and_claim([TopicPartition("orders", 0)], 10) == []
    result = run_cli("outbox", "replay", str(event.id), env={"OUTBOXKIT_DATABASE_URL": db_url})
    assert result.stdout.strip() == "replaying 1 record(s)"
    async with _storage(db_url) as storage:
        [again] = await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
    assert again.event_id == event.id
    assert again.id != record.id
