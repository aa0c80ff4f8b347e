"""What the outbox must learn of each batch a block published: which records Kafka accepted
(settled: deleted, or with retention marked published) and which it refused (their failure
recorded, and after ``max_attempts`` the record parked).

Settling shares the next claim's storage call (``settle_and_claim``): it is durable before that
call returns, so before any later record of the batch's keys is read, let alone sent (G2). When
a claim holds several batches, each is settled alone before the next goes out. A call that fails
may or may not have settled: the records stay to settle again, which is harmless; not settling
them would let Kafka see them again after their keys' next records.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import structlog

from outboxkit.relay.clock import StageClock
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.records import OutboxRecord, TopicPartition
from outboxkit.relay.settings import RelaySettings
from outboxkit.relay.storage import OutboxStorage


@dataclass(eq=False)
class Settler:
    """The records of one block that Kafka accepted and the outbox does not yet say so."""

    storage: OutboxStorage
    settings: RelaySettings
    metrics: RelayMetrics
    clock: StageClock
    _accepted: list[OutboxRecord] = field(default_factory=list, init=False)

    @property
    def _keep(self) -> bool:
        return self.settings.retention is not None

    @property
    def unsettled(self) -> int:
        """How many records Kafka accepted that the outbox does not yet say so."""
        return len(self._accepted)

    def accepted(self, records: list[OutboxRecord]) -> None:
        """Kafka has ``records``: the next storage call settles them."""
        self._accepted = records

    async def settle_and_claim(
        self, tps: Collection[TopicPartition], limit: int, *, max_bytes: int
    ) -> list[OutboxRecord]:
        """Settle what Kafka accepted and read the heads of ``tps``: one storage call."""
        accepted, self._accepted = self._accepted, []
        try:
            with self.clock.stage("claim"):
                return await self.storage.settle_and_claim(
                    tps,
                    limit,
                    published=accepted,
                    keep=self._keep,
                    depth=self.settings.claim_depth,
                    max_bytes=max_bytes,
                )
        except BaseException:
            # Maybe not settled: settling twice is harmless, not settling is not.
            self._accepted = accepted + self._accepted
            raise

    async def settle(self) -> None:
        """Settle what Kafka accepted, without reading (the claim usually does it on its way)."""
        accepted, self._accepted = self._accepted, []
        try:
            with self.clock.stage("settle"):
                await self.storage.settle_and_claim((), 1, published=accepted, keep=self._keep)
        except BaseException:
            self._accepted = accepted + self._accepted
            raise

    async def refused(
        self,
        rejected: Sequence[tuple[OutboxRecord, str]],
        log: structlog.typing.FilteringBoundLogger,
    ) -> bool:
        """Record that Kafka refused ``rejected`` (record, error): each record's attempt, and
        parked once it has had ``max_attempts``. True if any was parked."""
        parked_any = False
        for record, error in rejected:
            give_up = record.attempts + 1 >= self.settings.max_attempts
            parked_any |= give_up
            await self.storage.record_failure(record, error, give_up=give_up)
            self.metrics.publish_errors.labels(record.topic, "rejected").inc()
            if give_up:
                self.metrics.parked.labels(record.topic).inc()
            log.error(
                "record parked as failed" if give_up else "record rejected by Kafka",
                event_id=str(record.event_id),
                partition=f"{record.topic}/{record.partition}",
                attempts=record.attempts + 1,
                error=error,
            )
        return parked_any
