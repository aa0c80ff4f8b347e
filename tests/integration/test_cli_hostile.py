"""The operators' commands against hostile data (issue #26, items 5 and 6), on real servers:
a dead letter whose ``outboxkit-source-topic`` header names a topic it does not belong to is
replayed where its dead-letter topic belongs, never where the header says; record data with
terminal escape sequences and other control characters is printed escaped, never raw."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer

from outboxkit.backends import backend_for
from outboxkit.core.settings import ConnectionSettings
from outboxkit.inbox.deadletter import (
    ERROR_MESSAGE,
    ERROR_REASON,
    INBOX,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
)
from outboxkit.relay import OutboxStorage, TopicPartition
from outboxkit.schemas import encoding
from tests.helpers import run_cli, wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_harness import produce, read_all
from tests.integration.relay_harness import Step, register_topic

pytestmark = pytest.mark.timeout(180)

#: Sets the terminal's title (OSC 0 … BEL): what a hostile record puts in a header.
TITLE = "\x1b]0;pwned\x07"
#: Each kind of character a terminal may act on: C0 (ESC, BEL, CR, BS), DEL, C1 (CSI), and a
#: format character (U+202E RIGHT-TO-LEFT OVERRIDE) that reorders what follows it.
HOSTILE = f"{TITLE}\r\x08\x7f\x9b31m\u202e"


def _raw(stdout: str) -> list[str]:
    """The characters of ``stdout`` a terminal would act on (line breaks aside)."""
    return [c for c in stdout if not c.isprintable() and c != "\n"]


def _dead_letter(event_id: str, source_topic: str, **extra: str) -> list[tuple[str, bytes]]:
    headers = {
        "ce_id": event_id,
        "ce_type": "test.note",
        ERROR_REASON: "handler_failed",
        ERROR_MESSAGE: "handler cannot process it",
        SOURCE_TOPIC: source_topic,
        SOURCE_PARTITION: "0",
        SOURCE_OFFSET: "0",
        INBOX: "notes",
        **extra,
    }
    return [(name, value.encode()) for name, value in headers.items()]


async def _write(url: str, *events: Step) -> None:
    backend = backend_for(url)
    async with backend.transactions(source="urn:test", pool_size=1, connect_timeout=5) as tx:
        await tx.run(lambda t: tx.outbox.add_many(t, list(events)))


@contextlib.asynccontextmanager
async def _storage(url: str) -> AsyncIterator[OutboxStorage]:
    async with backend_for(url).outbox_storage(ConnectionSettings(database_url=url)) as storage:
        yield storage


def _env(kafka: str, topic: str) -> dict[str, str]:
    return {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka, "OUTBOXKIT_TOPICS": topic}


async def test_dlq_list_prints_hostile_headers_escaped(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    notes = await make_topic("notes")
    dlq = await make_topic(name=f"{notes}.dlq")
    event_id = f"{uuid.uuid4()}{HOSTILE}"
    headers = _dead_letter(
        event_id, notes, ce_type=f"test.note{TITLE}", **{ERROR_MESSAGE: "boom\nerror: forged"}
    )
    await produce(kafka_bootstrap, [], raw=[(dlq, b"{}", headers)])

    listed = run_cli("inbox", "dlq", "list", env=_env(kafka_bootstrap, notes))
    assert listed.returncode == 0, listed.stderr
    assert _raw(listed.stdout) == []
    [line] = listed.stdout.splitlines()  # a newline in a header does not forge a second line
    assert r"\x1b]0;pwned\x07\r\x08\x7f\x9b31m\u202e" in line
    assert r"test.note\x1b]0;pwned\x07" in line
    assert r"boom\nerror: forged" in line
    # --json was safe already (JSON escapes control characters), and keeps the raw values.
    as_json = run_cli("inbox", "dlq", "list", "--json", env=_env(kafka_bootstrap, notes))
    assert _raw(as_json.stdout) == []
    assert json.loads(as_json.stdout)[0]["event_id"] == event_id


async def test_dlq_replay_publishes_where_the_dead_letter_topic_belongs_not_where_a_header_says(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    notes = await make_topic("notes")
    dlq = await make_topic(name=f"{notes}.dlq")
    victim = await make_topic("victim")
    forged, honest = str(uuid.uuid4()), str(uuid.uuid4())
    # Written straight to the dead-letter topic by someone who may write there, not by an inbox.
    await produce(
        kafka_bootstrap,
        [],
        raw=[
            (dlq, b'{"forged": true}', _dead_letter(forged, victim)),
            (dlq, b'{"honest": true}', _dead_letter(honest, notes)),
        ],
    )

    replayed = run_cli("inbox", "dlq", "replay", "--all", env=_env(kafka_bootstrap, notes))
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.strip() == "replayed 2 records"
    # One line per misdirected record: shown, not obeyed.
    [warning] = [line for line in replayed.stderr.splitlines() if line.strip()]
    assert warning.startswith("warning: "), warning
    assert f"{dlq}/0@0" in warning
    assert victim in warning
    assert notes in warning

    assert await read_all(kafka_bootstrap, victim) == []
    landed = await read_all(kafka_bootstrap, notes)
    assert [r.value for r in landed] == [b'{"forged": true}', b'{"honest": true}']
    assert all(name not in dict(r.headers) for r in landed for name in (SOURCE_TOPIC, INBOX))


async def test_dlq_replay_to_an_explicit_topic(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    notes = await make_topic("notes")
    dlq = await make_topic(name=f"{notes}.dlq")
    elsewhere = await make_topic("elsewhere")
    event_id = str(uuid.uuid4())
    await produce(kafka_bootstrap, [], raw=[(dlq, b"{}", _dead_letter(event_id, notes))])

    env = _env(kafka_bootstrap, notes)
    replayed = run_cli("inbox", "dlq", "replay", event_id, "--to", elsewhere, env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stderr.strip() == ""
    assert [r.value for r in await read_all(kafka_bootstrap, elsewhere)] == [b"{}"]
    assert await read_all(kafka_bootstrap, notes) == []


async def test_outbox_pending_and_failed_print_hostile_data_escaped(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writers refuse such a topic name; a record written around them may still have one.
    monkeypatch.setattr(encoding, "read_back", lambda event, record: None)
    topic = f"orders{TITLE}"
    await register_topic(db_url, topic, 1)
    steps = [Step.model_construct(topic=topic, key=k, entity=k, seq=0) for k in "ab"]
    await _write(db_url, *steps)
    async with _storage(db_url) as storage:
        [first, _] = await storage.settle_and_claim([TopicPartition(topic, 0)], 10)
        await storage.record_failure(first, f"refused{HOSTILE}\nerror: forged", give_up=True)
    env = {"OUTBOXKIT_DATABASE_URL": db_url}

    pending = run_cli("outbox", "pending", env=env)
    assert pending.returncode == 0, pending.stderr
    assert _raw(pending.stdout) == []
    assert r"orders\x1b]0;pwned\x07/0: 1 pending" in pending.stdout

    failed = run_cli("outbox", "failed", env=env)
    assert failed.returncode == 0, failed.stderr
    assert _raw(failed.stdout) == []
    [line] = failed.stdout.splitlines()
    assert r"refused\x1b]0;pwned\x07\r\x08\x7f\x9b31m\u202e\nerror: forged" in line


@pytest.fixture
async def hostile_member(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> AsyncIterator[tuple[str, str]]:
    """A member of relay group ``outboxkit.relay.<name>`` whose client id is hostile (anyone
    who may join the group chooses their own): (the relay name, its topic)."""
    topic = await make_topic("orders")
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    member = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"outboxkit.relay.{name}",
        client_id=f"evil{HOSTILE}",
    )
    await member.start()
    try:
        await wait_for(lambda: bool(member.assignment()), within=30, what="the member joined")
        yield name, topic
    finally:
        await member.stop()


async def test_relay_status_prints_hostile_member_data_escaped(
    pg_url: str, kafka_bootstrap: str, hostile_member: tuple[str, str]
) -> None:
    name, topic = hostile_member
    env = {
        "OUTBOXKIT_DATABASE_URL": pg_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": topic,
        "OUTBOXKIT_RELAY_NAME": name,
    }
    status = run_cli("relay", "status", env=env)
    assert status.returncode == 0, status.stderr
    assert _raw(status.stdout) == []
    assert r"client evil\x1b]0;pwned\x07\r\x08\x7f\x9b31m\u202e" in status.stdout
