"""MongoDB implementation of :class:`~outboxkit.relay.storage.OutboxStorage`.

Collections (``outboxkit migrate`` creates them and their indexes; see
``outboxkit/migrations/files/mongodb/``):

- ``outboxkit.outbox``: one document per record; the relay chooses the head of a partition
  from ``outbox_head_idx`` alone (:mod:`.heads`).
- ``outboxkit.keys``: the last position of each key (:mod:`.positions`; a replay takes new
  ones, :mod:`.operations`).
- ``outboxkit.topics``: partition counts, kept from Kafka's metadata by the relay.
- ``outboxkit.relay_members``: the relays' member ids, each named by a client of its process
  (:mod:`.presence`).

No operation here holds a transaction across a Kafka send: the relay reads (majority read
concern: never a write a failover could roll back), publishes, then deletes or marks what Kafka
acknowledged, each a single statement. A relay SIGKILLed mid-batch leaves nothing locked.

Per-key order (G2) rests on two things here. The head of a partition is chosen by a **snapshot
read** (:mod:`.heads`): every transaction is seen whole or not at all. And the **order barrier**
(:mod:`.barrier`) publishes a key's record only right after its predecessor was settled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pymongo import UpdateOne

from outboxkit.core.mongodb import (
    MAJORITY_READ,
    MAJORITY_WRITE,
    Document,
    MongoConnection,
    collection,
    guarded,
)
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.mongodb.barrier import OrderBarrier
from outboxkit.relay.mongodb.heads import HEAD_INDEX, HeadReader
from outboxkit.relay.mongodb.presence import MongoPresence, member_versions
from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    TopicPartition,
)

T = TypeVar("T")


class MongoOutboxStorage(MongoConnection):
    """Use as ``async with MongoOutboxStorage(url) as storage:``.

    ``retention``: keep published records this long (for ``outboxkit outbox replay``) instead
    of deleting them; each is stamped with its expiry when published, and a TTL index on that
    stamp removes it even when no relay runs the cleanup."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 10.0,
        retention: timedelta | None = None,
        app_name: str = "outboxkit-relay",
        read_timeout: float | None = None,
    ) -> None:
        super().__init__(
            url, connect_timeout=connect_timeout, app_name=app_name, read_timeout=read_timeout
        )
        self._retention = retention
        self.outbox = collection(
            self.database, "outbox", read_concern=MAJORITY_READ, write_concern=MAJORITY_WRITE
        )
        self._topics = collection(self.database, "topics", write_concern=MAJORITY_WRITE)
        self._presence = MongoPresence(
            url,
            self.database,
            app_name=app_name,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        self.heads = HeadReader(self._client, self.outbox)
        self._barrier = OrderBarrier()

    async def _close_own_clients(self) -> None:
        await self._presence.close()

    # -- OutboxStorage ----------------------------------------------------------------------

    async def register_topics(self, partitions: Mapping[str, int]) -> None:
        if not partitions:
            return
        now = datetime.now(UTC)
        await _guard(
            self._topics.bulk_write(
                [
                    UpdateOne(
                        {"_id": topic},
                        {"$set": {"partitions": count, "updated_at": now}},
                        upsert=True,
                    )
                    for topic, count in sorted(partitions.items())
                ]
            )
        )

    async def settle_and_claim(
        self,
        tps: Collection[TopicPartition],
        limit: int,
        *,
        published: Sequence[OutboxRecord] = (),
        keep: bool = False,
        depth: int = 1,
        max_bytes: int | None = None,
    ) -> list[OutboxRecord]:
        if not tps:
            await self._settle(published, keep=keep)
            self._barrier.settle(published)
            return []
        # The settle's write and the heads' read are two round trips that run at once; the read
        # leaves out the records being settled (which it may still see pending). Nothing is
        # returned, so nothing published, before the settle is acknowledged (majority): a later
        # record of a key never goes out before its predecessor is settled (G2).
        settling: dict[TopicPartition, list[Any]] = {}
        for record in published:
            settling.setdefault(TopicPartition(record.topic, record.partition), []).append(
                record.id
            )
        read = await _alongside(
            self._settle(published, keep=keep),
            self.heads.read(tps, limit, depth=depth, max_bytes=max_bytes, settling=settling),
        )
        self._barrier.settle(published)
        return await self._barrier.admit(read, self.heads.older_pending)

    async def _settle(self, records: Sequence[OutboxRecord], *, keep: bool) -> None:
        """Delete ``records``, or with ``keep`` mark them published (as ``settle_and_claim``
        settles)."""
        if not records:
            return
        ids = [r.id for r in records]
        if keep:
            now = datetime.now(UTC)
            retention = timedelta(days=7) if self._retention is None else self._retention
            expires = now + retention
            await _guard(
                self.outbox.update_many(
                    {"_id": {"$in": ids}, "state": "pending"},
                    {"$set": {"state": "published", "published_at": now, "expires_at": expires}},
                )
            )
        else:
            await _guard(self.outbox.delete_many({"_id": {"$in": ids}}))

    async def record_failure(self, record: OutboxRecord, error: str, *, give_up: bool) -> None:
        changes: Document = {"last_error": error[:4000]}
        if give_up:
            changes["state"] = "failed"
        await _guard(
            self.outbox.update_one(
                {"_id": record.id, "state": "pending"},
                {"$inc": {"attempts": 1}, "$set": changes},
            )
        )

    async def purge_published(self, older_than: timedelta, limit: int) -> int:
        # Each kept record carries its expiry (stamped with the relay's retention, which is
        # older_than); outbox_expires_ttl serves this read, and deletes them by itself too.
        expired = self.outbox.find(
            {"expires_at": {"$lte": datetime.now(UTC)}}, {"_id": True}
        ).limit(limit)
        ids = [doc["_id"] for doc in await _guard(expired.to_list())]
        if not ids:
            return 0
        result = await _guard(self.outbox.delete_many({"_id": {"$in": ids}}))
        return int(result.deleted_count)

    async def backlog(self) -> list[PartitionBacklog]:
        """Two covered index scans: pending records from outbox_head_idx (the oldest by its
        position, which is the server clock in µs when written), failed ones from
        outbox_failed_idx; neither reads a document."""
        by_partition = {"_id": {"topic": "$topic", "partition": "$partition"}}
        pending = await _guard(
            self._aggregate(
                [
                    {"$match": {"state": "pending"}},
                    {
                        "$group": {
                            **by_partition,
                            "n": {"$sum": 1},
                            "oldest": {"$min": "$position"},
                            "now": {"$max": "$$NOW"},  # mongod's clock, as the positions
                        }
                    },
                ],
                hint=HEAD_INDEX,
            )
        )
        failed = await _guard(
            self._aggregate(
                [{"$match": {"state": "failed"}}, {"$group": {**by_partition, "n": {"$sum": 1}}}],
                hint="outbox_failed_idx",
            )
        )
        rows: dict[tuple[str, int], PartitionBacklog] = {}
        for row in pending:
            tp = (row["_id"]["topic"], row["_id"]["partition"])
            oldest = datetime.fromtimestamp(row["oldest"] / 1_000_000, UTC)
            age = max(row["now"].timestamp() - row["oldest"] / 1_000_000, 0.0)
            rows[tp] = PartitionBacklog(
                *tp, pending=row["n"], oldest_created_at=oldest, oldest_age=age
            )
        for row in failed:
            tp = (row["_id"]["topic"], row["_id"]["partition"])
            found = rows.get(tp, PartitionBacklog(*tp, pending=0, oldest_created_at=None))
            rows[tp] = replace(found, failed=row["n"])
        return [rows[tp] for tp in sorted(rows)]

    async def announce_member(self, group: str, member_id: str) -> None:
        await self._presence.announce(group, member_id)

    async def departed_members(self, group: str, own_member_id: str) -> list[str]:
        return await self._presence.departed(group, own_member_id)

    async def forget_members(self, group: str, member_ids: list[str]) -> None:
        await self._presence.forget(group, member_ids)

    async def member_versions(self, group: str) -> dict[str, str | None]:
        return await _guard(member_versions(self.outbox.database, group))

    # -- helpers -----------------------------------------------------------------------------

    async def _aggregate(self, pipeline: list[Document], *, hint: str) -> list[Document]:
        cursor = await self.outbox.aggregate(pipeline, hint=hint)
        return await cursor.to_list()


async def _alongside(first: Awaitable[None], second: Awaitable[T]) -> T:
    """``second``'s result, both run at once; if ``first`` fails, ``second`` is cancelled and
    ``first``'s error raised (as is, not in an exception group: callers retry on it)."""
    task = asyncio.ensure_future(second)
    try:
        await first
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    return await task


async def _guard(operation: Awaitable[T]) -> T:
    """A server or network failure surfaces as the relay's retriable error."""
    return await guarded(operation, StorageUnavailableError)
