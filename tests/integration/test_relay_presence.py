"""Relays learn from PostgreSQL that another relay's process ended, sooner than Kafka's session
timeout (relay/postgres/presence.py): a relay's presence session holds an advisory lock, and the
server releases it the moment the session ends."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit.relay import PostgresOutboxStorage
from outboxkit.relay.postgres import presence

GROUP = "outboxkit.relay.test"


async def _end_session(url: str, application_name: str) -> None:
    """What the server does when a relay process dies: its presence session ends."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"{application_name}-presence",),
        )
        assert len(await cur.fetchall()) == 1


async def test_a_member_whose_session_ended_is_reported_once_and_a_live_one_never(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(presence, "RECONNECT_GRACE", 0.0)
    a = PostgresOutboxStorage(pg_url, application_name="relay-a")
    b = PostgresOutboxStorage(pg_url, application_name="relay-b")
    async with a, b:
        await a.announce_member(GROUP, "member-a")
        await b.announce_member(GROUP, "member-b")
        assert await b.departed_members(GROUP, "member-b") == []
        assert await a.departed_members(GROUP, "member-a") == []
        # A rejoined under a new member id (Kafka forgot it): the old id is not a departure.
        await a.announce_member(GROUP, "member-a2")
        assert await b.departed_members(GROUP, "member-b") == []

        await _end_session(pg_url, "relay-a")
        assert await b.departed_members(GROUP, "member-b") == ["member-a2"]
        assert await b.departed_members(GROUP, "member-b") == []  # once

        # A's next check finds its session gone and announces itself on a new one.
        await a.announce_member(GROUP, "member-a2")
        assert await b.departed_members(GROUP, "member-b") == []
        # Members of another group are not this group's business.
        async with PostgresOutboxStorage(pg_url, application_name="relay-c") as c:
            await c.announce_member("outboxkit.relay.other", "member-c")
            await _end_session(pg_url, "relay-c")
            assert await a.departed_members(GROUP, "member-a2") == []
            assert await b.departed_members("outboxkit.relay.other", "member-b") == ["member-c"]


async def test_a_relay_that_just_got_the_database_back_reports_no_departure(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a database restart every relay's session ended: the first one back must not take
    the others for dead before they had a check of their own to reconnect."""
    a = PostgresOutboxStorage(pg_url, application_name="relay-a")
    b = PostgresOutboxStorage(pg_url, application_name="relay-b")
    async with a, b:
        await a.announce_member(GROUP, "member-a")
        await b.announce_member(GROUP, "member-b")
        await _end_session(pg_url, "relay-a")
        await _end_session(pg_url, "relay-b")
        await a.announce_member(GROUP, "member-a")  # finds its session ended, opens another
        assert await a.departed_members(GROUP, "member-a") == []
        monkeypatch.setattr(presence, "RECONNECT_GRACE", 0.0)  # B had its chance
        assert await a.departed_members(GROUP, "member-a") == ["member-b"]
