"""The MongoDB relay's liveness check at constant cost (#26 item 7; relay/mongodb/presence.py):
``$currentOp`` walks every connection of mongod (1.2 ms at 10 connections, 39.6 ms at 3,000,
every second, per relay), so it is run only for members whose heartbeat stopped. Against a real
mongod, with a real relay-like process frozen (SIGSTOP) and then SIGKILLed.
``bench/presence.py`` prints the check's cost at 10 and 3,000 connections."""

from __future__ import annotations

import os
import signal
from contextlib import AbstractContextManager
from subprocess import Popen

import pytest

from outboxkit.relay import MongoOutboxStorage
from outboxkit.relay.mongodb.presence import MongoPresence
from tests.helpers import holds_for, wait_for
from tests.integration.presence_process import announcing_process

GROUP = "outboxkit.relay.cost"


def _beating(url: str, member: str) -> AbstractContextManager[Popen[str]]:
    """A relay as far as presence goes: it announces itself every half second, as relays do at
    each check, until it is frozen or killed."""
    return announcing_process(url, GROUP, member, app_name="beating", beat_every=0.5)


async def test_connections_are_walked_only_for_a_member_whose_heartbeat_stopped(
    migrated_mongodb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the other relay beats, A's checks never run ``$currentOp`` (their cost does not
    grow with mongod's connections) and report nothing. Frozen, it is a suspect, but its
    connections are open: still not reported (as before). Killed, it is reported, within
    STALE_AFTER plus a few checks. Catches a check that walks every connection each time, and
    a heartbeat that reports a frozen relay or misses a dead one."""
    url = migrated_mongodb_url
    walks = 0
    walk = MongoPresence._live_app_names

    async def counted(self: MongoPresence, app_names: list[str]) -> set[str] | None:
        nonlocal walks
        walks += 1
        return await walk(self, app_names)

    monkeypatch.setattr(MongoPresence, "_live_app_names", counted)
    with _beating(url, "member-p") as other:
        async with MongoOutboxStorage(url, app_name="relay-a") as a:

            async def check() -> list[str]:
                await a.announce_member(GROUP, "member-a")
                return await a.departed_members(GROUP, "member-a")

            async def reports_nothing() -> None:
                assert await check() == []

            await holds_for(4.0, reports_nothing)  # past STALE_AFTER (2.5 s) since A's first beat
            assert walks == 0, "a beating member is never looked for among the connections"

            os.kill(other.pid, signal.SIGSTOP)

            async def suspected() -> bool:
                assert await check() == [], "a frozen relay's connections are open"
                return walks > 0

            await wait_for(suspected, within=10, what="the frozen relay a suspect")
            frozen_walks = walks
            await holds_for(2.0, reports_nothing)  # "a frozen relay's connections are open"
            assert walks > frozen_walks

            other.kill()
            other.wait()
            departed: list[str] = []

            async def reported() -> bool:
                departed.extend(await check())
                return bool(departed)

            await wait_for(reported, within=8, what="the killed relay reported")
            assert departed == ["member-p"]
            await a.forget_members(GROUP, departed)  # as the relay does once Kafka was told
            assert await check() == [], "reported until forgotten, not after"
