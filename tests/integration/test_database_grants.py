"""The PostgreSQL grants of docs/security.md are enough, run as written: a writer, a relay and an
inbox, each logged in as a role with only its grants, write, publish and handle events."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from outboxkit.backends import backend_for
from tests.integration.conftest import REPO, MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    effects,
    inbox_env,
    wait_effects,
)
from tests.integration.relay_harness import (
    read_topic,
    register_topic,
    relay_env,
    relays,
    wait_pending,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: The roles the document grants to, and what this test names them.
DOCUMENTED_ROLES = ("orders_app", "outboxkit_relay", "billing_inbox")


def documented_grants() -> str:
    """The ```sql block of docs/security.md."""
    text = (REPO / "docs" / "security.md").read_text()
    [sql] = re.findall(r"^```sql\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return sql


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest.fixture
def roles(pg_url: str) -> Iterator[dict[str, str]]:
    """Login roles (no superuser, no ownership) for the documented ones, granted exactly the
    documented SQL on this test's database."""
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"{role}_{suffix}" for role in DOCUMENTED_ROLES}
    sql = documented_grants()
    for role, name in names.items():
        sql = re.sub(rf"\b{role}\b", name, sql)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for name in names.values():
            conn.execute(f'CREATE ROLE "{name}" LOGIN')
        conn.execute(sql)
    try:
        yield names
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'DROP OWNED BY "{name}"')
                conn.execute(f'DROP ROLE "{name}"')


async def test_the_documented_grants_let_each_worker_do_its_job(
    pg_url: str,
    roles: dict[str, str],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    topic = await make_topic("granted", partitions=2)
    await make_topic(name=f"{topic}.dlq")
    await register_topic(pg_url, topic, 2)
    await create_effects_table(pg_url)
    inbox_role = roles["billing_inbox"]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what the handler writes
        conn.execute(f'GRANT INSERT, SELECT ON effects TO "{inbox_role}"')

    events = [Payment(topic=topic, entity=f"e{i % 4}", seq=i) for i in range(30)]
    app_url = as_role(pg_url, roles["orders_app"])
    async with backend_for(app_url).transactions(
        source="urn:test", pool_size=1, connect_timeout=5
    ) as tx:
        for event in events:
            async with tx.transaction() as t:
                await tx.outbox.add(t, event)

    relay_url = as_role(pg_url, roles["outboxkit_relay"])
    inbox_url = as_role(pg_url, inbox_role)
    worker = InboxProcess(tmp_path, inbox_env(inbox_url, kafka_bootstrap, topic))
    with relays(tmp_path, relay_env(relay_url, kafka_bootstrap, topic)) as [relay]:
        worker.start()
        try:
            await wait_pending(pg_url, within=60, what="the relay to publish everything")

            await wait_effects(
                pg_url,
                lambda found: len(found) >= len(events),
                within=60,
                what="the inbox to handle everything",
            )
        finally:
            worker.kill()
        log = relay.log() + worker.log()
    assert "permission denied" not in log, log
    on_topic = await read_topic(kafka_bootstrap, topic, 2)
    assert {e for records in on_topic.values() for _, e in records} == {e.id for e in events}
    assert sorted(e for e, _, _ in await effects(pg_url)) == sorted(e.id for e in events)
