"""The seam between the inbox consumer and a database."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from outboxkit.inbox.handlers import Handler
from outboxkit.schemas import Event


class InboxStore(Protocol):
    async def process(
        self,
        consumer: str,
        event: Event,
        handler: Handler,
        *,
        topic: str,
        partition: int,
        offset: int,
    ) -> bool:
        """In one transaction: record (consumer, event id); if it was new, run ``handler``.
        Return whether the handler ran (False: a duplicate, absorbed). A handler exception
        rolls everything back and propagates."""

    async def purge(self, older_than: timedelta, limit: int) -> int:
        """Delete at most ``limit`` dedupe records older than ``older_than``."""

    async def count(self, consumer: str) -> int:
        """Dedupe records of ``consumer`` (a metric)."""
