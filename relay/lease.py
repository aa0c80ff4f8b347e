"""A block's producer lease: the right to publish the block's partitions through one producer.

Taken only by a member of the current generation that owns the whole block, in four steps:
confirm the membership, fence the other transactional ids that could carry its partitions (G4),
start the producer (which fences earlier users of the block's own id), confirm again. Dropped
(the producer closed) after any Kafka error: the producer may be in any state, so the next
attempt takes a fresh lease, which with transactions also aborts whatever the last one left
open. After Kafka fenced the block, :meth:`ProducerLease.regain` waits for the group to confirm
the block is still this relay's (a fence raced a rebalance) before publishing again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from outboxkit.relay.blocks import Block, fence_ids
from outboxkit.relay.clock import StageClock
from outboxkit.relay.fencing import Fencer
from outboxkit.relay.publisher import Publisher, PublisherFactory
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.retry import RETRIABLE, RetryLater, pause
from outboxkit.relay.settings import RelaySettings


class NotConfirmedError(RetryLater):
    """The group did not confirm this relay's membership: no producer may start yet."""


class Confirm(Protocol):
    def __call__(self, partitions: frozenset[TopicPartition]) -> Awaitable[bool]: ...


@dataclass(eq=False)
class ProducerLease:
    """One block's producer, started only while the group confirms the block is this relay's."""

    block: Block
    tps: Sequence[TopicPartition]
    settings: RelaySettings
    confirm: Confirm
    fencer: Fencer
    publisher_factory: PublisherFactory
    clock: StageClock
    #: The producer while the lease is held.
    publisher: Publisher | None = field(default=None, init=False)

    async def acquire(self, log: structlog.typing.FilteringBoundLogger) -> Publisher:
        """The lease's producer, starting one (confirm, fence, init, confirm) if none is held.
        Raises :class:`NotConfirmedError` (retriable) if the group does not confirm."""
        if self.publisher is not None:
            return self.publisher
        settings = self.settings
        if settings.transactional:
            # Only a member of the current generation that still owns the whole block may
            # initialise producers: a zombie's init could fence the rightful owner, or run beside
            # it under another block's id.
            await self._confirmed()
            others = fence_ids(settings.group_id, self.tps) - {
                self.block.transactional_id(settings.group_id)
            }
            with self.clock.stage("fence"):
                async with asyncio.timeout(settings.publish_timeout):
                    await self.fencer.fence(others)
        publisher = self.publisher_factory(self.block)
        try:
            with self.clock.stage("init"):
                async with asyncio.timeout(settings.publish_timeout):
                    await publisher.start()  # fences earlier users of the block's own id
            if settings.transactional:
                # Once more, now that the producer exists: a rebalance that gave a partition to
                # another relay between the first confirmation and this init would let both
                # publish. Confirmed now, the group is still at this generation, so whoever gets
                # these partitions next initialises after this producer and fences it.
                await self._confirmed()
        except BaseException:
            with contextlib.suppress(Exception):
                await publisher.close()
            raise
        self.publisher = publisher
        log.debug("producer started", transactional=settings.transactional)
        return publisher

    async def drop(self) -> None:
        """After a Kafka error the producer may be in any state: close it; the next
        :meth:`acquire` starts a fresh one (which, with transactions, also aborts whatever this
        one left open)."""
        if self.publisher is not None:
            publisher, self.publisher = self.publisher, None
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.settings.publish_timeout):
                    await publisher.close()

    async def regain(self, stop: asyncio.Event) -> bool:
        """Fenced: either the group moves this block's partitions (the relay stops its worker:
        ``stop``, False) or it confirms they are still ours (a fence raced a rebalance: True),
        asked every heartbeat interval: the pace at which the group's changes reach a member."""
        while not stop.is_set():
            await pause(self.settings.heartbeat_interval, stop)
            if stop.is_set():
                return False
            with contextlib.suppress(*RETRIABLE):
                if await self.confirm(frozenset(self.tps)):
                    return True
        return False

    async def _confirmed(self) -> None:
        with self.clock.stage("confirm"):
            if not await self.confirm(frozenset(self.tps)):
                raise NotConfirmedError(f"{self.block}: membership not confirmed")
