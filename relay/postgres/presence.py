"""PostgreSQL presence (:mod:`outboxkit.relay.presence`): each relay holds a session-level
advisory lock, keyed by its member id, on one connection of its own (its *presence session*) and
records the member id in ``outboxkit.relay_members``; a lock that another session can take
belongs to a session that has ended (migrations/files/postgres/0006_relay_members.sql).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from outboxkit._version import __version__
from outboxkit.core.postgres import connect_session
from outboxkit.core.sql import load_queries
from outboxkit.relay import presence
from outboxkit.relay.exceptions import StorageUnavailableError

_QUERIES = load_queries("outboxkit.relay.postgres", "queries.sql")


def member_lock_key(group: str, member_id: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``member_id`` of ``group``."""
    return int.from_bytes(presence.member_digest(group, member_id), "big", signed=True)


class PostgresPresence:
    """This relay's presence session, and the check for the sessions of others."""

    def __init__(
        self,
        url: str,
        *,
        application_name: str,
        connect_timeout: float,
        read_timeout: float | None = None,
    ) -> None:
        self._url = url
        self._application_name = application_name
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._opened_at = 0.0
        #: (group, member id, lock key) announced on the current session.
        self._announced: tuple[str, str, int] | None = None
        self._lock = asyncio.Lock()

    async def announce(self, group: str, member_id: str) -> None:
        """Hold ``member_id``'s lock from now on (releasing the one announced before). Called
        again at every check: it makes sure the session is still there, and opens a new one
        (announcing again) if it is not."""
        async with self._lock, self._unavailable():
            announced = self._announced is not None and self._announced[:2] == (group, member_id)
            if announced and await self._alive():
                return
            conn = await self._session()
            key = member_lock_key(group, member_id)
            previous, self._announced = self._announced, None
            if previous is not None:
                await conn.execute("SELECT pg_advisory_unlock(%s)", [previous[2]])
            # A survivor's check holds the lock for the length of one statement: try again at
            # the next check rather than wait here.
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", [key])
            row = await cur.fetchone()
            if not row or not row[0]:
                return
            await conn.execute(
                _QUERIES["announce_member"],
                {
                    "group": group,
                    "member": member_id,
                    "lock_key": key,
                    "version": __version__,
                    "previous_group": previous[0] if previous else None,
                    "previous": previous[1] if previous else None,
                },
            )
            self._announced = (group, member_id, key)

    async def departed(self, group: str, own_member_id: str) -> list[str]:
        """Members of ``group`` whose presence session has ended, until :meth:`forget` is told
        of them. None while this relay's own session is missing or younger than
        ``RECONNECT_GRACE``: a relay that lost the database cannot tell whether the others lost
        it too."""
        async with self._lock, self._unavailable():
            conn = self._conn
            if (
                conn is None
                or self._announced is None
                or time.monotonic() - self._opened_at < presence.RECONNECT_GRACE
            ):
                return []
            cur = await conn.execute(
                _QUERIES["departed_members"], {"group": group, "own": own_member_id}
            )
            return [str(member_id) for (member_id,) in await cur.fetchall()]

    async def forget(self, group: str, member_ids: list[str]) -> None:
        """Stop reporting ``member_ids`` (departed, and removed from Kafka's group)."""
        async with self._lock, self._unavailable():
            conn = await self._session()
            await conn.execute(_QUERIES["forget_members"], {"group": group, "members": member_ids})

    async def _alive(self) -> bool:
        """Whether the current session is still there (a database restart ends it)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return False
        try:
            await conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    async def _session(self) -> psycopg.AsyncConnection[Any]:
        """The current session if usable, else a new one (nothing announced on it yet)."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        await self.close()
        conn = await connect_session(
            self._url,
            application_name=f"{self._application_name}-presence",
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
        )
        self._conn, self._opened_at = conn, time.monotonic()
        return conn

    @contextlib.asynccontextmanager
    async def _unavailable(self) -> AsyncIterator[None]:
        """A lost connection is closed (the next check opens another) and surfaces as the
        relay's retriable error."""
        try:
            yield
        except psycopg.OperationalError as exc:
            await self.close()
            raise StorageUnavailableError(f"PostgreSQL is unavailable: {exc}") from exc

    async def close(self) -> None:
        """End the presence session: to the others, this relay has now departed."""
        conn, self._conn, self._announced = self._conn, None, None
        if conn is not None:
            await conn.close()


async def running_versions(conn: psycopg.AsyncConnection[Any]) -> dict[str | None, int]:
    """The outboxkit release of every live relay (presence session open) → how many; None for
    relays of a release that announced no version. Empty before migration 0006."""
    cur = await conn.execute("SELECT to_regclass('outboxkit.relay_members') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return {}
    cur = await conn.execute(_QUERIES["running_versions"])
    return {version: int(count) for version, count in await cur.fetchall()}
