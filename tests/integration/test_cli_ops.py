"""Operators' commands against real servers: `outboxkit inbox dlq list|replay` (a handler is
fixed, its dead-lettered event replayed, and it takes effect once) and `outboxkit topics sync`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

from outboxkit.relay import PostgresOutbox
from tests.helpers import run_cli
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    wait_caught_up,
)
from tests.integration.relay_harness import Step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def _run_until_caught_up(tmp_path: Path, env: dict[str, str], kafka: str, topic: str) -> None:
    worker = InboxProcess(tmp_path, env).start()
    try:
        await wait_caught_up(kafka, group_of(topic), topic, 1, within=60, what="caught up")
        assert worker.alive(), worker.log()
    finally:
        assert worker.terminate() == 0, worker.log()


async def test_a_dead_lettered_event_is_replayed_after_the_fix_and_takes_effect_once(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic("payments")
    await make_topic(name=f"{topic}.dlq")
    await create_effects_table(pg_url)
    buggy = Payment(topic=topic, entity="trips-the-bug", seq=0)
    fine = Payment(topic=topic, entity="fine", seq=0)
    await produce(kafka_bootstrap, [buggy, fine], raw=[(topic, b"\x00not json", [])])
    env = inbox_env(pg_url, kafka_bootstrap, topic, TEST_FAILING_ENTITY="trips-the-bug")
    await _run_until_caught_up(tmp_path, env, kafka_bootstrap, topic)
    assert [e[0] for e in await effects(pg_url)] == [fine.id]

    cli_env = {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "OUTBOXKIT_TOPICS": topic}
    listed = run_cli("inbox", "dlq", "list", "--json", env=cli_env)
    assert listed.returncode == 0, listed.stderr
    letters = json.loads(listed.stdout)
    assert [(d["reason"], d["event_id"]) for d in letters] == [
        ("handler_failed", str(buggy.id)),
        ("missing_header", None),
    ]
    assert letters[0]["error"] == "handler cannot process trips-the-bug"
    assert letters[0]["source"] == f"{topic}/0@0"

    unknown = uuid.uuid4()
    missing = run_cli("inbox", "dlq", "replay", str(unknown), env=cli_env)
    assert missing.returncode == 1
    assert f"no dead-lettered record with event id {unknown}" in missing.stderr
    assert run_cli("inbox", "dlq", "replay", env=cli_env).returncode == 2  # ids or --all

    # The handler is fixed (the worker restarts without the bug); the event is replayed, then
    # asked again: said and left (it printed a blank line, and replayed it again unasked); then
    # replayed once more with --again.
    replayed = run_cli("inbox", "dlq", "replay", str(buggy.id), env=cli_env)
    assert (replayed.stdout, replayed.stderr) == ("replayed 1 record\n", "")
    twice = run_cli("inbox", "dlq", "replay", str(buggy.id), env=cli_env)
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout == "replayed 0 records; 1 replayed already (--again replays it once more)\n"
    assert twice.stderr.startswith(f"already replayed: {buggy.id} (replayed to {topic}/0@"), twice
    again = run_cli("inbox", "dlq", "replay", str(buggy.id), "--again", env=cli_env)
    assert again.stdout == "replayed 1 record\n", again.stderr
    # The list leaves the replayed one out, and says so; --replayed shows it, marked.
    listed = run_cli("inbox", "dlq", "list", env=cli_env)
    assert listed.stdout.splitlines()[1:] == [
        "1 replayed dead letter not shown (--replayed shows them)"
    ], listed.stdout
    assert "missing_header" in listed.stdout.splitlines()[0]
    marked = run_cli("inbox", "dlq", "list", "--replayed", env=cli_env).stdout.splitlines()
    assert f"(replayed to {topic}/0@" in marked[0], marked
    assert marked[0].endswith(", 2 times)"), marked
    [again_json] = json.loads(
        run_cli("inbox", "dlq", "list", "--json", "--replayed", env=cli_env).stdout
    )[:1]
    assert len(again_json["replayed"]) == 2
    fixed = inbox_env(pg_url, kafka_bootstrap, topic, TEST_FAILING_ENTITY="-")
    await _run_until_caught_up(tmp_path, fixed, kafka_bootstrap, topic)
    assert sorted(str(e[0]) for e in await effects(pg_url)) == sorted([str(buggy.id), str(fine.id)])


async def test_topics_sync_lets_writers_add_events_before_any_relay_ran(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic("orders", partitions=3)
    event = Step(topic=topic, entity="e", seq=0)
    outbox = PostgresOutbox(source="urn:test")
    env = {"OUTBOXKIT_DATABASE_URL": pg_url, "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}

    absent = run_cli("topics", "sync", "--topics", f"{topic}-absent", env=env)
    assert absent.returncode == 1
    assert f"`outboxkit topics create {topic}-absent`" in absent.stderr

    synced = run_cli("topics", "sync", "--topics", topic, "--json", env=env)
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout) == {topic: 3}
    async with await psycopg.AsyncConnection.connect(pg_url) as conn, conn.transaction():
        await outbox.add(conn, event)
