"""The inbox worker's periodic tasks — the purge of expired dedupe records and the regular offset
commit — end when cancelled, even when the call in progress lost the cancellation, as
pymongo's can on Python 3.11 (``asyncio.wait_for``: core/waiting.py). A stopping worker would
otherwise wait for them until its grace ran out, then leave them running."""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import pytest
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from outboxkit.inbox import InboxWorker, InMemoryInboxStore
from outboxkit.inbox.offsets import OffsetCommitter
from tests.helpers import LosesOneCancellation
from tests.unit.inbox_fakes import TP, CommitLog, charging_inbox, metrics, settings


class _Store(InMemoryInboxStore):
    def __init__(self, loses: LosesOneCancellation) -> None:
        super().__init__()
        self._loses = loses

    async def purge(self, older_than: timedelta, limit: int) -> int:
        await self._loses()
        return 0


class _Log(CommitLog):
    def __init__(self, loses: LosesOneCancellation) -> None:
        super().__init__(ends={TP: 10})
        self._loses = loses

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        await self._loses()


def _purge(loses: LosesOneCancellation) -> Coroutine[Any, Any, None]:
    worker = InboxWorker(charging_inbox(), settings(cleanup_interval=0.01), _Store(loses))
    return worker._clean_up()


def _regular_commit(loses: LosesOneCancellation) -> Coroutine[Any, Any, None]:
    committer = OffsetCommitter(_Log(loses), settings(), inbox="payments", metrics=metrics())
    committer.partition(TP).advance(4)
    return committer.commit_regularly(0.01)


@pytest.mark.parametrize("side_task", [_purge, _regular_commit], ids=["purge", "regular commit"])
async def test_a_side_task_ends_when_its_call_lost_the_cancellation(side_task: Any) -> None:
    loses = LosesOneCancellation()
    await loses.assert_ends_when_cancelled(side_task(loses))
