"""Fencing: initialising transactional ids a relay is about to take over, without producing.

``InitProducerId`` for a ``transactional.id`` bumps its producer epoch: the transaction
coordinator aborts that id's open transaction (or finishes a commit already prepared) and
refuses everything the previous producer sends or commits afterwards. A relay does this for every
id that could carry a partition it gains (:func:`outboxkit.relay.blocks.fence_ids`) before it
reads the partition's outbox. Those ids need no producer of their own, so the requests go
through one shared client: one FindCoordinator and one InitProducerId per id, concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Protocol

import structlog
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.errors import (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorError,
    for_code,
)
from aiokafka.protocol.transaction import InitProducerIdRequest

from outboxkit.core import kafka_clients
from outboxkit.relay.settings import RelaySettings

logger = structlog.get_logger("outboxkit.relay")

#: Answers that mean "ask again shortly": the previous owner's transaction is being aborted,
#: or the coordinator moved or is loading.
_AGAIN = (
    ConcurrentTransactions,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)


class Fencer(Protocol):
    async def fence(self, transactional_ids: Collection[str]) -> None:
        """Return once no earlier producer of any of these ids can commit anything more."""

    async def close(self) -> None: ...


class KafkaFencer:
    def __init__(self, settings: RelaySettings) -> None:
        self._settings = settings
        self._client = kafka_clients.client(
            settings,
            client_id=f"{settings.group_id}-fencer",
            request_timeout_ms=int(max(settings.transaction_timeout, 10) * 1000),
        )
        self._started = False
        self._lock = asyncio.Lock()

    async def fence(self, transactional_ids: Collection[str]) -> None:
        async with self._lock:
            if not self._started:
                await self._client.bootstrap()
                self._started = True
        await asyncio.gather(*(self._fence_one(tid) for tid in sorted(transactional_ids)))

    async def _fence_one(self, transactional_id: str) -> None:
        delay = 0.005
        timeout_ms = int(self._settings.transaction_timeout * 1000)
        while True:
            try:
                node_id = await self._client.coordinator_lookup(
                    CoordinationType.TRANSACTION, transactional_id
                )
            except _AGAIN:  # the transaction log is still being created or moved
                error: type[KafkaError] = CoordinatorNotAvailableError
            else:
                response = await self._client.send(
                    node_id,
                    InitProducerIdRequest(transactional_id, timeout_ms),
                    group=ConnectionGroup.COORDINATION,
                )
                error = for_code(response.error_code)
                if error.errno == 0:
                    return
                if not issubclass(error, _AGAIN):
                    raise error(transactional_id)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def close(self) -> None:
        if self._started:
            try:
                await self._client.close()
            except KafkaError as exc:
                logger.debug("fencer did not close cleanly", error=repr(exc))
