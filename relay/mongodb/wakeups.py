"""Wake-ups on MongoDB: a change stream on the outbox collection.

A change stream costs writers nothing (mongod reads its oplog), so unlike PostgreSQL's NOTIFY it
needs no "is a relay waiting?" signalling: :meth:`set_waiting` does nothing and every insert
wakes the partition's worker, busy or not.

The stream is a hint, never the truth: the relay reads the head of each partition from the
indexed collection. So a stream that breaks — network, primary step-down, the oplog no longer
holding its resume point (``ChangeStreamHistoryLost``), the collection dropped (``invalidate``)
— is simply opened again *from now*, and the first thing yielded on every (re)open is ``None``:
"look again everywhere". Nothing can be missed, and no resume token needs keeping (the driver
still resumes by itself across the transient errors it knows, before we see them). If the
stream cannot be opened at all, the relay runs on its periodic sweep until it can, and this logs
why. (A standalone mongod, which has neither change streams nor snapshot reads, is refused at
start: ``outboxkit relay`` says it is not a replica set.)

The stream is read one ``getMore`` at a time (``try_next``, each waiting at most
:data:`_AWAIT_MS` for a change), not with ``async for``, whose loop over empty answers stays
inside pymongo: between two of them the reader raises the cancellation pymongo may have lost
(:mod:`outboxkit.core.waiting`), so a stopping relay is not kept waiting by its change stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import structlog
from pymongo.errors import PyMongoError

from outboxkit.core.mongodb import Collection, Document, describe
from outboxkit.core.waiting import raise_if_cancelled, sleep_unless_cancelled
from outboxkit.relay.records import TopicPartition

logger = structlog.get_logger("outboxkit.relay")

#: Inserts wake their partition; an update that makes a record pending again (``outboxkit
#: outbox retry``) wakes everyone (rare). Deletes and "published" updates are filtered out by
#: mongod, so a busy relay is not flooded with its own writes. The projection keeps events small.
_PIPELINE: list[Document] = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert"},
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.state": "pending",
                },
                {"operationType": {"$in": ["invalidate", "drop", "rename", "dropDatabase"]}},
            ]
        }
    },
    {"$project": {"operationType": 1, "fullDocument.topic": 1, "fullDocument.partition": 1}},
]

_RETRY_MIN, _RETRY_MAX = 0.1, 5.0

#: How long mongod holds an empty ``getMore`` for a change (its own default, made explicit):
#: the longest a cancellation pymongo lost waits to be raised again.
_AWAIT_MS = 1000


class MongoWakeups:
    """The :class:`~outboxkit.relay.storage.WakeupSource` of a MongoDB outbox."""

    def __init__(self, outbox: Collection) -> None:
        self._outbox = outbox

    async def set_waiting(self, tps: Iterable[TopicPartition], waiting: bool) -> int:
        """Nothing to declare: the change stream reports every insert anyway."""
        return 0

    async def earlier_writers_ended(self, tps: Iterable[TopicPartition]) -> bool:
        """Always: an insert committed after the stream opened is on the stream."""
        return True

    async def wakeups(self) -> AsyncIterator[TopicPartition | None]:
        delay = _RETRY_MIN
        while True:
            try:
                async with await self._outbox.watch(
                    _PIPELINE, max_await_time_ms=_AWAIT_MS
                ) as stream:
                    delay = _RETRY_MIN
                    yield None  # the stream starts now: whatever came before must be read
                    while stream.alive:
                        change = await stream.try_next()
                        raise_if_cancelled()
                        if change is None:
                            continue
                        kind = change["operationType"]
                        if kind == "insert":
                            doc = change["fullDocument"]
                            yield TopicPartition(doc["topic"], doc["partition"])
                        elif kind == "update":
                            yield None
                        else:
                            logger.warning("outbox change stream ended, reopening", change=kind)
                            break
            except PyMongoError as exc:
                logger.warning(
                    "outbox change stream failed; the periodic sweep covers until it reopens",
                    error=describe(exc),
                    retry_in=round(delay, 2),
                )
                await sleep_unless_cancelled(delay)
                delay = min(delay * 2, _RETRY_MAX)
