"""MongoDB presence (:mod:`outboxkit.relay.presence`): each relay keeps a client of its own whose
appName names its member id, and records the member id in ``outboxkit.relay_members``. The
driver holds connections to every replica-set member for as long as the process lives (its
monitors), and mongod drops a connection from ``$currentOp`` the moment its socket closes: a
recorded member whose appName no connection carries has ended.

``$currentOp`` of every user needs the ``inprog`` privilege (e.g. the ``clusterMonitor`` role).
Without it, or through ``mongos`` (each router lists only its own connections), the check is
off: a dead relay then leaves the group at its Kafka session timeout.

``$currentOp`` walks every connection of the server (1.2 ms at 10 connections, 39.6 ms at
3,000, every second, per relay), so it is asked only about suspects: each relay's record
carries a heartbeat (mongod's clock, renewed at each announcement, every check), and only a
member whose heartbeat is older than :data:`STALE_AFTER` is looked for among the connections.
While every member beats, a check is two small indexed operations, whatever the connection
count; a dead relay is found :data:`STALE_AFTER` later than before, and still only when its
connections are gone (a frozen relay's are not: it is not reported, as before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import structlog
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from outboxkit._version import __version__
from outboxkit.core.mongodb import Client, Database, collection, guarded, make_client
from outboxkit.relay import presence
from outboxkit.relay.exceptions import StorageUnavailableError

logger = structlog.get_logger("outboxkit.relay")

T = TypeVar("T")

_UNAUTHORIZED = 13

#: How often a presence client's monitors check each member (pymongo's default is 10 000 ms). A
#: client does nothing else, so after a member restarts its monitor reconnects only at its next
#: check: with the default, a restarted member that became primary listed no connection of a
#: live relay for up to 10 s, longer than the reconnect grace (presence.RECONNECT_GRACE), and a
#: live relay whose heartbeats had paused (a failover) was removed from the group as dead.
PRESENCE_HEARTBEAT_MS = 1000

#: Seconds of mongod's uptime before its connection list is trusted: the reconnect grace, plus
#: two presence heartbeats for a live relay's monitor to find the restarted mongod (its next
#: check comes up to one heartbeat after mongod answers, and a starved process runs it late:
#: with the grace alone, a live relay was reported departed beside a loaded test run).
_RESTART_GRACE = presence.RECONNECT_GRACE + 2 * PRESENCE_HEARTBEAT_MS / 1000

#: Milliseconds without a heartbeat after which a member is a suspect (relays renew theirs at
#: every check, every OUTBOXKIT_DEPARTED_CHECK_INTERVAL, 1 s by default).
STALE_AFTER = 2500
#: The records whose heartbeat is older than that (mongod's clock).
_STALE = {"$expr": {"$lt": ["$at", {"$subtract": ["$$NOW", STALE_AFTER]}]}}


class MongoPresence:
    """This relay's presence client, and the check for the presence of others."""

    def __init__(
        self,
        url: str,
        database: Database,
        *,
        app_name: str,
        connect_timeout: float,
        read_timeout: float | None = None,
    ) -> None:
        self._url = url
        self._client_of: Client = database.client
        self._members = collection(database, "relay_members")
        #: Heartbeats need no durability (a lost one makes a suspect, which $currentOp clears):
        #: acknowledged by the primary alone, not waiting for the journal or the majority (what
        #: that saves per check: docs/relay.md, "Ownership", the MongoDB presence).
        self._beats = collection(database, "relay_members", write_concern=WriteConcern(w=1))
        self._prefix = f"{app_name}-presence-"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._presence: Client | None = None
        #: (group, member id) announced with the current presence client.
        self._announced: tuple[str, str] | None = None
        #: Why the check is off on this deployment (found once), or None.
        self._unsupported: str | None = None
        self._lock = asyncio.Lock()

    def _app_name(self, group: str, member_id: str) -> str:
        return self._prefix + presence.member_digest(group, member_id).hex()

    async def announce(self, group: str, member_id: str) -> None:
        """Be ``member_id`` from now on: a presence client named after it, and its record."""
        async with self._lock:
            if self._announced == (group, member_id):
                # The driver keeps the client's connections, and restores them: only the beat.
                await self._beat(group, member_id)
                return
            previous = self._announced
            await self.close()
            client = make_client(
                self._url,
                connect_timeout=self._connect_timeout,
                read_timeout=self._read_timeout,
                app_name=self._app_name(group, member_id),
                heartbeatFrequencyMS=PRESENCE_HEARTBEAT_MS,
            )
            self._presence = client
            await _guard(client.admin.command("ping"))
            if previous is not None:
                await _guard(self._members.delete_one({"_id": _id(*previous)}))
            await self._beat(group, member_id, durable=True)
            self._announced = (group, member_id)

    async def _beat(self, group: str, member_id: str, *, durable: bool = False) -> None:
        """Renew this member's record and heartbeat (mongod's clock: relays' clocks may differ),
        creating it if a peer removed it. The announcement itself is ``durable`` (majority,
        journaled): a record lost in a mongod crash would hide this relay's death for good."""
        members = self._members if durable else self._beats
        await _guard(
            members.update_one(
                {"_id": _id(group, member_id)},
                [
                    {
                        "$set": {
                            "app_name": self._app_name(group, member_id),
                            "at": "$$NOW",
                            # `outboxkit migrate --check` reads it (running_versions).
                            "version": {"$literal": __version__},
                        }
                    }
                ],
                upsert=True,
            )
        )

    async def departed(self, group: str, own_member_id: str) -> list[str]:
        """Recorded members of ``group`` whose heartbeat stopped and that no connection names
        any more, until :meth:`forget` is told of them. None while this relay's own presence is
        not listed, right after mongod restarted (unlike PostgreSQL sessions, the driver's
        connections come back by themselves, so mongod's uptime tells), or where the check is
        off (see the module)."""
        async with self._lock:
            if self._unsupported is not None or self._announced is None:
                return []
            recorded = await _guard(self._members.find({"_id.group": group, **_STALE}).to_list())
            candidates = {
                doc["_id"]["member"]: doc["app_name"]
                for doc in recorded
                if doc["_id"]["member"] != own_member_id
            }
            if not candidates:
                return []
            own = self._app_name(group, own_member_id)
            live = await self._live_app_names([own, *candidates.values()])
            if live is None or own not in live:
                return []  # this view is not to be trusted (see _live_app_names)
            return [member for member, app in candidates.items() if app not in live]

    async def forget(self, group: str, member_ids: list[str]) -> None:
        """Stop reporting ``member_ids`` (departed, and removed from Kafka's group). A record
        beaten since (a relay that only lost mongod, back) is kept."""
        ids = [_id(group, member) for member in member_ids]
        await _guard(self._members.delete_many({"_id": {"$in": ids}, **_STALE}))

    async def _live_app_names(self, app_names: list[str]) -> set[str] | None:
        """Which of ``app_names`` the primary's connections carry; None when that cannot be
        trusted: the check is off here, or mongod started too recently for every live relay's
        driver to have reconnected."""
        admin = self._client_of.admin
        try:
            # One round trip says both what answers (mongod or mongos) and since when.
            status: dict[str, Any] = await _guard(
                admin.command({"serverStatus": 1, "repl": 0, "metrics": 0, "locks": 0})
            )
            if status.get("process") == "mongos":
                self._off("connected through mongos, which lists only its own connections")
                return None
            if float(status.get("uptime", 0)) < _RESTART_GRACE:
                return None
            cursor = await _guard(
                admin.aggregate(
                    [
                        {"$currentOp": {"allUsers": True, "idleConnections": True}},
                        {"$match": {"appName": {"$in": app_names}}},
                        {"$group": {"_id": "$appName"}},
                    ]
                )
            )
            rows = await _guard(cursor.to_list())
        except OperationFailure as exc:
            if exc.code == _UNAUTHORIZED:
                self._off(f"$currentOp of all users is not allowed ({exc}); grant clusterMonitor")
                return None
            raise StorageUnavailableError(f"MongoDB refused the presence check: {exc}") from exc
        return {str(row["_id"]) for row in rows}

    def _off(self, why: str) -> None:
        self._unsupported = why
        logger.warning("dead relays leave the group only at their Kafka session timeout", why=why)

    async def close(self) -> None:
        """Close the presence client: to the others, this relay has now departed."""
        client, self._presence, self._announced = self._presence, None, None
        if client is not None:
            await client.close()


#: A record is taken for a live relay's while its heartbeat is younger than this (relays beat
#: every second): generous, so that a relay whose beats were held up is still counted.
RUNNING_WITHIN_MS = 30_000


async def running_versions(database: Database) -> dict[str | None, int]:
    """The outboxkit release of every relay that beat in the last :data:`RUNNING_WITHIN_MS`
    → how many; None for relays of a release that recorded no version. A relay that died
    less than that ago is counted too: the answer errs towards "still running"."""
    fresh = {"$expr": {"$gte": ["$at", {"$subtract": ["$$NOW", RUNNING_WITHIN_MS]}]}}
    counts: dict[str | None, int] = {}
    async for doc in collection(database, "relay_members").find(fresh, {"version": 1}):
        version = doc.get("version")
        counts[version] = counts.get(version, 0) + 1
    return counts


async def member_versions(database: Database, group: str) -> dict[str, str | None]:
    """The members of ``group`` recorded here → the outboxkit release each runs."""
    found: dict[str, str | None] = {}
    async for doc in collection(database, "relay_members").find(
        {"_id.group": group}, {"version": 1}
    ):
        found[doc["_id"]["member"]] = doc.get("version")
    return found


async def _guard(operation: Awaitable[T]) -> T:
    return await guarded(operation, StorageUnavailableError)


def _id(group: str, member_id: str) -> dict[str, str]:
    return {"group": group, "member": member_id}
