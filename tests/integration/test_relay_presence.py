"""Relays learn from the database that another relay's process ended, sooner than Kafka's
session timeout (relay/presence.py): on PostgreSQL its presence session's advisory lock is
released, on MongoDB its presence client's connections leave ``$currentOp``, the moment the
process dies. Real processes are SIGKILLed here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from subprocess import Popen

import psycopg
import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from outboxkit.embedded.mongodb import EmbeddedMongo
from outboxkit.relay import MongoOutboxStorage, PostgresOutboxStorage, presence
from outboxkit.relay.exceptions import StorageUnavailableError
from tests.helpers import wait_for
from tests.integration.presence_process import announcing_process

GROUP = "outboxkit.relay.test"
OTHER_GROUP = "outboxkit.relay.other"


def _storage(url: str, name: str) -> PostgresOutboxStorage | MongoOutboxStorage:
    if url.startswith("mongodb"):
        return MongoOutboxStorage(url, app_name=name)
    return PostgresOutboxStorage(url, application_name=name)


def _announcer(url: str, member: str, group: str = GROUP) -> AbstractContextManager[Popen[str]]:
    """A process that announced ``member``; the test may SIGKILL it (it is killed at the end)."""
    return announcing_process(url, group, member)


async def _listed(url: str, app_name: str, member: str) -> bool:
    """Whether mongod lists a connection of ``member``'s presence client."""
    wanted = f"{app_name}-presence-{presence.member_digest(GROUP, member).hex()}"
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
    try:
        cursor = await client.admin.aggregate(
            [
                {"$currentOp": {"allUsers": True, "idleConnections": True}},
                {"$match": {"appName": wanted}},
            ]
        )
        return bool(await cursor.to_list())
    except PyMongoError:
        return False
    finally:
        await client.close()


async def test_a_killed_relay_is_reported_departed_until_forgotten_and_a_live_one_never(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = db_url
    monkeypatch.setattr(presence, "RECONNECT_GRACE", 0.0)
    with (
        _announcer(url, "member-a") as dying,
        _announcer(url, "member-x", group=OTHER_GROUP) as elsewhere,
        _announcer(url, "member-s") as surviving,
    ):
        async with _storage(url, "relay-b") as b, _storage(url, "relay-c") as c:
            await b.announce_member(GROUP, "member-b")
            await c.announce_member(GROUP, "member-c")
            assert await b.departed_members(GROUP, "member-b") == []
            # B rejoined under a new member id (Kafka forgot it): its old id is not a departure.
            await b.announce_member(GROUP, "member-b2")
            assert await c.departed_members(GROUP, "member-c") == []

            for process in (dying, elsewhere):
                process.kill()
                process.wait()
            departed: list[str] = []

            async def reported() -> bool:
                departed.extend(await b.departed_members(GROUP, "member-b2"))
                return bool(departed)

            await wait_for(reported, within=5, what="the killed relay reported departed")
            assert departed == ["member-a"]  # not member-x: another group's business
            # Reported again, by any relay, until forgotten (Kafka may not have been told yet).
            assert await c.departed_members(GROUP, "member-c") == ["member-a"]
            # Forgetting a live one (it lost the database and announced itself again) keeps it.
            await c.forget_members(GROUP, ["member-a", "member-s"])
            assert await b.departed_members(GROUP, "member-b2") == []
            assert await c.departed_members(GROUP, "member-c") == []
            surviving.kill()
            surviving.wait()
            departed.clear()
            await wait_for(reported, within=5, what="the survivor's death reported")
            assert departed == ["member-s"]


async def test_postgresql_a_relay_that_just_got_the_database_back_reports_no_departure(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a database restart every relay's session ended: the first one back must not take
    the others for dead before they had a check of their own to reconnect."""

    async def end_sessions() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'relay-_-presence'"
            )

    async with _storage(pg_url, "relay-a") as a, _storage(pg_url, "relay-b") as b:
        await a.announce_member(GROUP, "member-a")
        await b.announce_member(GROUP, "member-b")
        await end_sessions()
        await a.announce_member(GROUP, "member-a")  # finds its session ended, opens another
        assert await a.departed_members(GROUP, "member-a") == []
        monkeypatch.setattr(presence, "RECONNECT_GRACE", 0.0)  # B had its chance
        assert await a.departed_members(GROUP, "member-a") == ["member-b"]


async def test_mongodb_a_relay_reports_no_departure_right_after_mongod_restarted(
    mongo_factory: Callable[..., EmbeddedMongo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """mongod restarted: every relay's driver reconnects, but not all at once, and the first
    ones back must not take the others for dead (mongod's uptime says it restarted). B is killed
    meanwhile, so that it is certainly not back: with the guard A reports nothing, without it B."""
    server = mongo_factory()
    url = server.url("presence")
    with _announcer(url, "member-b") as behind:
        async with _storage(url, "relay-a") as a:
            await a.announce_member(GROUP, "member-a")
            server.stop("immediate")
            behind.kill()
            server.start()
            departed: list[str] = []

            async def reported() -> bool:
                with contextlib.suppress(StorageUnavailableError):
                    departed.extend(await a.departed_members(GROUP, "member-a"))
                return bool(departed)

            await wait_for(
                lambda: _listed(url, "relay-a", "member-a"), within=30, what="A's presence back"
            )
            monkeypatch.setattr(presence, "RECONNECT_GRACE", 3600.0)  # mongod is younger
            assert await a.departed_members(GROUP, "member-a") == []
            monkeypatch.setattr(presence, "RECONNECT_GRACE", 0.0)
            await wait_for(reported, within=30, what="B reported once the guard is off")
            assert departed == ["member-b"]
