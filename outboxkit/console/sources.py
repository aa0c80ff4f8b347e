"""Where the console's pages read from and act through: the same objects the commands use.

=====================  ==================================  ===================================
page                   reads / does                        as the command
=====================  ==================================  ===================================
overview               :class:`GroupStatusReader`,          ``outboxkit relay status``,
                       ``storage.backlog()``,               ``outbox pending``,
                       :class:`InboxStatusReader`           ``inbox status``
outbox                 ``OutboxOperations``                 ``outbox failed|retry|skip``
dead letters           ``read_dead_letters``,               ``inbox dlq list|replay``
                       ``replay_dead_letters``
=====================  ==================================  ===================================

Opened on first use and kept open (a pool of one or two database connections, two Kafka admin
clients and two consumers), so that a refresh costs no new connection; closed with the console
(its lifespan when it runs alone, its :class:`~outboxkit.service.Outboxkit`'s end when mounted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from outboxkit.backends import backend_for
from outboxkit.console.settings import ConsoleSettings, InboxView
from outboxkit.core.settings import ConnectionSettings, load_settings
from outboxkit.inbox import DeadLetter, read_dead_letters
from outboxkit.inbox.status import InboxStatusReader
from outboxkit.relay import OutboxOperations, OutboxStorage, RelaySettings
from outboxkit.relay.status import GroupStatusReader
from outboxkit.schemas import EventRegistry

__all__ = ["Sources"]


class Sources:
    """The console's open storage, repairs and Kafka readers (see the module)."""

    def __init__(
        self,
        settings: ConsoleSettings,
        *,
        relay: RelaySettings | None,
        inboxes: Sequence[InboxView],
        registry: EventRegistry | None,
    ) -> None:
        self.settings = settings
        #: The relay whose group and partitions the overview shows (None: no topics set).
        self.relay = relay
        self.inboxes = list(inboxes)
        self.registry = registry
        self._stack = contextlib.AsyncExitStack()
        self._lock = asyncio.Lock()
        self._storage: OutboxStorage | None = None
        self._operations: OutboxOperations | None = None
        self._relay_reader: GroupStatusReader | None = None
        self._inbox_reader: InboxStatusReader | None = None
        self._closed = False

    @classmethod
    def from_settings(
        cls,
        settings: ConsoleSettings,
        *,
        relay: RelaySettings | None = None,
        inboxes: Sequence[InboxView] = (),
        registry: EventRegistry | None = None,
    ) -> Sources:
        """The relay is ``relay`` or, with topics set, the relay of ``settings.relay_name`` on
        them; the inboxes ``inboxes`` and those the settings name."""
        if relay is None and settings.topics:
            relay = relay_settings(settings)
        shown = {view.name: view for view in inboxes}
        for view in settings.inbox_views:
            shown.setdefault(view.name, view)
        return cls(settings, relay=relay, inboxes=list(shown.values()), registry=registry)

    async def storage(self) -> OutboxStorage:
        async with self._lock:
            if self._storage is None:
                self._check_open()
                backend = backend_for(self.settings.database_url)
                self._storage = await self._stack.enter_async_context(
                    backend.outbox_storage(self.settings)
                )
            return self._storage

    async def operations(self) -> OutboxOperations:
        async with self._lock:
            if self._operations is None:
                self._check_open()
                backend = backend_for(self.settings.database_url)
                self._operations = await self._stack.enter_async_context(
                    backend.outbox_operations(self.settings)
                )
            return self._operations

    async def relay_reader(self) -> GroupStatusReader | None:
        if self.relay is None:
            return None
        async with self._lock:
            if self._relay_reader is None:
                self._check_open()
                self._relay_reader = await self._stack.enter_async_context(
                    GroupStatusReader(self.relay)
                )
            return self._relay_reader

    async def inbox_reader(self) -> InboxStatusReader:
        async with self._lock:
            if self._inbox_reader is None:
                self._check_open()
                self._inbox_reader = await self._stack.enter_async_context(
                    InboxStatusReader(self.settings)
                )
            return self._inbox_reader

    def inbox(self, name: str) -> InboxView | None:
        return next((view for view in self.inboxes if view.name == name), None)

    def dlq_topics(self, view: InboxView) -> list[str]:
        return [f"{topic}{self.settings.dlq_suffix}" for topic in view.topics]

    async def dead_letters(self, view: InboxView) -> list[DeadLetter]:
        """The first ``console_page_size`` records of the inbox's dead-letter topics (never
        more: a page never scans a whole topic)."""
        return await read_dead_letters(
            self.settings, self.dlq_topics(view), limit=self.settings.console_page_size
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the console is closed")

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            self._storage = self._operations = None
            self._relay_reader = self._inbox_reader = None
            await self._stack.aclose()


def relay_settings(settings: ConsoleSettings) -> RelaySettings:
    """The relay of ``settings.relay_name`` on ``settings.topics``, with the connection
    settings of ``settings`` and the rest (its partitions per transaction: the blocks) from
    the environment, as the relay reads them."""
    given: dict[str, Any] = {
        name: getattr(settings, name) for name in ConnectionSettings.model_fields
    }
    return load_settings(RelaySettings, **given, relay_name=settings.relay_name)
