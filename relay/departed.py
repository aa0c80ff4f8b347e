"""The relay's check for departed relays: announce this process, evict the dead ones' members.

Kafka waits for a dead member until its session times out, and every rebalance with it, so
relays that restart faster than that would keep the group rebalancing. The database learns of a
death at once (:mod:`outboxkit.relay.presence`): each relay announces its process there and
removes from the group the members of every process the storage saw end
(:meth:`OutboxStorage.departed_members <outboxkit.relay.storage.OutboxStorage.departed_members>`).
The process, not the member, is announced: a relay has its process key before it joins, so one
killed while its join is pending (all of them, after a broker restart) is removed too, and a
lone relay's replacement removes its predecessor before its own join completes. Removing a
member that is in fact alive costs it a rejoin, never a guarantee (fencing, G4).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from aiokafka.errors import KafkaError

from outboxkit.core.waiting import raise_if_cancelled, wait_set
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage

logger = structlog.get_logger("outboxkit.relay")

#: A check for dead relays that keeps failing for a reason other than an outage (a missing
#: privilege) is logged this often.
_REFUSED_LOG_EVERY = 60.0

__all__ = ["DepartedCheck", "Evictor"]


class Evictor(Protocol):
    """The part of the group membership the check needs
    (:class:`~outboxkit.relay.engine.Ownership`)."""

    @property
    def process_key(self) -> str: ...

    async def evict_process(self, process_key: str) -> int: ...


@dataclass
class DepartedCheck:
    """Keeps this relay's process announced and evicts the members of departed ones, every
    ``departed_check_interval`` and again right after each assignment."""

    settings: RelaySettings
    storage: OutboxStorage
    group: Evictor
    metrics: RelayMetrics
    _assigned: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _refused_logged: float = field(default=-_REFUSED_LOG_EVERY, init=False)

    @staticmethod
    def wanted(settings: RelaySettings) -> bool:
        """Whether the relay runs the check: not with static membership, where a member keeps
        its place while it restarts (removing it would be the very rebalance static
        membership avoids), nor with ``departed_check_interval`` 0."""
        return settings.departed_check_interval > 0 and settings.instance_id is None

    async def announce(self) -> None:
        """Announce the process once, before the join: a relay killed while its join is
        pending can then be removed for it. Failures are left to :meth:`run` to report."""
        with contextlib.suppress(Exception):
            await self.storage.announce_member(self.settings.group_id, self.group.process_key)

    def assigned(self) -> None:
        """Check again now: a rebalance may have been waiting for the dead."""
        self._assigned.set()

    async def run(self) -> None:
        while True:
            await self.check()
            raise_if_cancelled()  # the database call may have lost it (core/waiting.py)
            await wait_set(self._assigned, self.settings.departed_check_interval)
            self._assigned.clear()

    async def check(self) -> None:
        """Announce this process and evict every departed one's members; a failure is logged,
        never raised (the session timeout still applies: this only comes sooner)."""
        group, key = self.settings.group_id, self.group.process_key
        try:
            await self.storage.announce_member(group, key)
            for gone in await self.storage.departed_members(group, key):
                removed = await self.group.evict_process(gone)
                # Forgotten only once Kafka was told: one found while the broker is down is
                # still there when it is back (with every member it loaded from its log).
                await self.storage.forget_members(group, [gone])
                if removed:
                    self.metrics.departed_removed.inc(removed)
                    logger.warning(
                        "removed a dead relay from the group: its database connections ended",
                        process=gone,
                        members=removed,
                    )
        except (StorageUnavailableError, KafkaError, OSError) as exc:
            logger.info("could not check for dead relays", error=repr(exc))
        except Exception as exc:  # e.g. no privilege on relay_members: never stop the relay
            now = time.monotonic()
            if now - self._refused_logged >= _REFUSED_LOG_EVERY:
                self._refused_logged = now
                logger.warning(
                    "cannot check for dead relays; they leave the group at their session timeout",
                    error=repr(exc),
                )
