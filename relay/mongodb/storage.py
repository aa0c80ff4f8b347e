"""MongoDB implementation of :class:`~outboxkit.relay.storage.OutboxStorage`.

Collections (``outboxkit migrate`` creates them and their indexes; see
``outboxkit/migrations/files/mongodb/``):

- ``outboxkit.outbox``: one document per record; the relay chooses the head of a partition by
  ``(topic, partition, position, _id, key)`` from ``outbox_head_idx`` alone, a partial index
  that holds pending records only, so the choice stays an index range scan however many
  published or failed records the collection keeps, and reads only the chosen documents.
- ``outboxkit.keys``: the last position of each key (:mod:`.positions`).
- ``outboxkit.topics``: partition counts, kept from Kafka's metadata by the relay.
- ``outboxkit.relay_members``: the relays' member ids, each named by a client of its process
  (:mod:`.presence`).

No operation here holds a transaction across a Kafka send: the relay reads (majority read
concern: never a write a failover could roll back), publishes, then deletes or marks what Kafka
acknowledged, each a single statement. A relay SIGKILLed mid-batch leaves nothing locked.

Per-key order (G2) rests on two things here. The head of a partition is chosen by a **snapshot
read** (a point in time of majority-committed data): an ordinary read yields every so often
and resumes on a newer snapshot, so a transaction that committed meanwhile shows only the
records past the scan's position, and a key's later records looked like its head (issue #32:
seq 12-15 published before 8-11 of one transaction). And the **order barrier**
(:mod:`.barrier`) publishes a key's record only right after its predecessor was settled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from pymongo import UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import OperationFailure, PyMongoError

from outboxkit.core.mongodb import (
    MAJORITY_READ,
    MAJORITY_WRITE,
    Document,
    MongoConnection,
    collection,
    guarded,
    in_transaction,
    is_unavailable,
)
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.mongodb.barrier import OrderBarrier, link_of
from outboxkit.relay.mongodb.positions import take_positions
from outboxkit.relay.mongodb.presence import MongoPresence
from outboxkit.relay.records import (
    OutboxRecord,
    PartitionBacklog,
    RecordInfo,
    RecordState,
    TopicPartition,
)

T = TypeVar("T")

#: The head's choice reads this many records per record it may return: with repeated keys near the
#: head, a wider window still fills the batch with distinct keys.
_SCAN_FACTOR = 4
#: Bytes of blocked keys the head read's ``$nin`` carries at most (mongod's commands are limited
#: to 16 MB; keys are at most 4 KiB, relay/limits.py): beyond, keys are dropped after the read.
_BLOCKED_IN_QUERY = 1_000_000
#: A record's bytes as relay/limits.py's record_bytes counts them: key, value, header names
#: (UTF-8) and values (headers are stored as [name, value] pairs).
_SIZE: Document = {
    "$add": [
        {"$binarySize": "$key"},
        {"$ifNull": [{"$binarySize": "$value"}, 0]},
        {
            "$reduce": {
                "input": "$headers",
                "initialValue": 0,
                "in": {
                    "$add": [
                        "$$value",
                        {"$strLenBytes": {"$arrayElemAt": ["$$this", 0]}},
                        {"$binarySize": {"$arrayElemAt": ["$$this", 1]}},
                    ]
                },
            }
        },
    ]
}
#: The partial index of pending records the head read uses (migrations/files/mongodb/0002).
HEAD_INDEX = "outbox_head_idx"

_RECORD_FIELDS = {
    "topic": True,
    "partition": True,
    "key": True,
    "value": True,
    "headers": True,
    "event_id": True,
    "attempts": True,
    "created_at": True,
    "position": True,
    "previous": True,
}

#: Server errors of a snapshot read that a later read does not meet: the point in time is
#: older than the history mongod keeps, or newer than a collection's catalog change (a restart
#: or failover); the relay retries them as an unavailable database.
_SNAPSHOT_ERRORS = {"SnapshotTooOld", "SnapshotUnavailable"}


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
    ) -> None:
        super().__init__(url, connect_timeout=connect_timeout, app_name=app_name)
        self._retention = retention
        self.outbox = collection(
            self.database, "outbox", read_concern=MAJORITY_READ, write_concern=MAJORITY_WRITE
        )
        self._keys = collection(self.database, "keys")
        self._topics = collection(self.database, "topics", write_concern=MAJORITY_WRITE)
        self._presence = MongoPresence(
            url, self.database, app_name=app_name, connect_timeout=connect_timeout
        )
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
        # Settled first (the write is acknowledged before the reads start), so the reads find
        # the settled keys' next records and never the settled ones.
        await self.mark_published(published, keep=keep)
        self._barrier.settle(published)
        if not tps:
            return []
        # Three reads whatever the number of partitions: the blocked keys of all of them, the
        # covered choice of each partition's head (concurrently), the chosen documents.
        blocked = await self._blocked_keys(tps)
        chosen = await asyncio.gather(
            *(self._choose_head(tp, blocked.get(tp, []), limit, depth) for tp in tps)
        )
        ids = [record_id for head in chosen for record_id in head]
        if not ids:
            return []
        by_id = {doc["_id"]: doc for doc in await self._read(ids, max_bytes)}
        # A record the CLI skipped or retried meanwhile is simply not there.
        read = [(_record(by_id[i]), link_of(by_id[i])) for i in ids if i in by_id]
        return await self._barrier.admit(read, self._older_pending)

    async def _read(self, ids: list[Any], max_bytes: int | None) -> list[Document]:
        """The documents of ``ids``, within the claim's byte bound: of each partition, in the
        head's order (key by key, each key's oldest first), those while the bytes of the ones
        before them (:func:`~outboxkit.relay.limits.record_bytes`) stay under ``max_bytes``.
        Read whole as long as no partition's documents pass the bound (the usual case: one
        read, as without a bound); else sized on the server first, then only the chosen
        documents are read."""
        cursor = self.outbox.find({"_id": {"$in": ids}}, _RECORD_FIELDS)
        docs: list[Document] = []
        size: dict[tuple[str, int], int] = {}
        try:
            async for doc in cursor:
                tp = (doc["topic"], doc["partition"])
                size[tp] = size.get(tp, 0) + _doc_bytes(doc)
                if max_bytes is not None and size[tp] > max_bytes:
                    break
                docs.append(doc)
            else:
                return docs
        except PyMongoError as exc:
            if is_unavailable(exc):
                raise StorageUnavailableError(f"MongoDB is unavailable: {exc}") from exc
            raise
        finally:
            await cursor.close()
        del docs  # some partition needs cutting: what was read so far is not it
        assert max_bytes is not None
        return await self._read_bounded(ids, max_bytes)

    async def _read_bounded(self, ids: list[Any], max_bytes: int) -> list[Document]:
        fields = {"topic": True, "partition": True, "size": _SIZE}
        sized = await _guard(self.outbox.find({"_id": {"$in": ids}}, fields).to_list())
        by_id = {doc["_id"]: doc for doc in sized}
        before: dict[tuple[str, int], int] = {}
        chosen = []
        for record_id in ids:  # the head's order
            doc = by_id.get(record_id)
            if doc is None:
                continue
            tp = (doc["topic"], doc["partition"])
            if before.get(tp, 0) < max_bytes:
                chosen.append(record_id)
                before[tp] = before.get(tp, 0) + doc["size"]
        found = self.outbox.find({"_id": {"$in": chosen}}, _RECORD_FIELDS)
        return await _guard(found.to_list())

    async def _choose_head(
        self, tp: TopicPartition, blocked: list[bytes], limit: int, depth: int
    ) -> list[Any]:
        """The ``_id``s of ``tp``'s head: key by key, oldest key first, each key's oldest
        first (see :meth:`head_pipeline`), from one snapshot: every transaction is seen whole
        or not at all. Blocked keys are left out by the query up to :data:`_BLOCKED_IN_QUERY`
        bytes of them, so that no command grows with the parked keys (mongod refuses a command
        over 16 MB); any more are left out of what it returns."""
        in_query, rest = _split_by_size(blocked, _BLOCKED_IN_QUERY)
        pipeline = self.head_pipeline(tp, in_query, limit, depth)
        async with self._client.start_session(snapshot=True, causal_consistency=False) as session:
            cursor = await _guard_snapshot(
                self.outbox.aggregate(pipeline, hint=HEAD_INDEX, session=session)
            )
            heads = await _guard_snapshot(cursor.to_list())
        skipped = set(rest)
        return [i for head in heads if bytes(head["_id"]) not in skipped for i in head["ids"]]

    async def _older_pending(
        self, keys: Mapping[TopicPartition, dict[bytes, int]]
    ) -> set[tuple[str, bytes]]:
        """The keys of ``keys`` with a pending record older than the given position (the order
        barrier's check), one read per partition (:meth:`older_pending_query`)."""

        async def of(tp: TopicPartition, positions: dict[bytes, int]) -> set[tuple[str, bytes]]:
            where, fields = self.older_pending_query(tp, positions)
            found = self.outbox.find(where, fields, hint=HEAD_INDEX)
            return {
                (tp.topic, bytes(doc["key"]))
                for doc in await _guard(found.to_list())
                if doc["position"] < positions[bytes(doc["key"])]
            }

        found = await asyncio.gather(*(of(tp, positions) for tp, positions in keys.items()))
        return set().union(*found)

    @staticmethod
    def older_pending_query(
        tp: TopicPartition, positions: Mapping[bytes, int]
    ) -> tuple[Document, Document]:
        """Filter and projection of the pending records of ``positions``' keys below the
        newest position asked about: a covered range scan of outbox_head_idx over the head's
        window, where those records were read."""
        where = {
            "topic": tp.topic,
            "partition": tp.partition,
            "state": "pending",
            "position": {"$lt": max(positions.values())},
            "key": {"$in": list(positions)},
        }
        return where, {"_id": False, "key": True, "position": True}

    async def _blocked_keys(
        self, tps: Collection[TopicPartition]
    ) -> dict[TopicPartition, list[bytes]]:
        """Per partition, the keys with a failed record (per-key order: nothing overtakes it).
        Few by construction, read from outbox_failed_idx in one query for all partitions."""
        where = {
            "state": "failed",
            "$or": [{"topic": tp.topic, "partition": tp.partition} for tp in tps],
        }
        fields = {"_id": False, "topic": True, "partition": True, "key": True}
        blocked: dict[TopicPartition, list[bytes]] = {}
        for doc in await _guard(self.outbox.find(where, fields).to_list()):
            keys = blocked.setdefault(TopicPartition(doc["topic"], doc["partition"]), [])
            if doc["key"] not in keys:
                keys.append(doc["key"])
        return blocked

    def head_pipeline(
        self, tp: TopicPartition, blocked: list[bytes], limit: int, depth: int = 1
    ) -> list[Document]:
        """The choice of ``tp``'s head, made by mongod from outbox_head_idx alone (a covered
        read: every field it uses is in the index, no document is fetched): the first
        ``4 * limit`` pending records in position order (an index range scan, no sort: the
        index is in order; blocked keys left out so that they do not crowd the window); of
        each key among them its ``depth`` oldest, in order (``$firstN`` keeps the scan's order:
        a prefix of the key's pending records, none skipped, since a key's records commit in
        position order); the ``limit`` keys whose oldest record comes first."""
        match: Document = {"topic": tp.topic, "partition": tp.partition, "state": "pending"}
        if blocked:
            match["key"] = {"$nin": blocked}
        return [
            {"$match": match},
            {"$sort": {"position": 1, "_id": 1}},
            {"$limit": limit * _SCAN_FACTOR},
            {
                "$group": {
                    "_id": "$key",
                    "ids": {"$firstN": {"input": "$_id", "n": depth}},
                    "id": {"$first": "$_id"},
                    "at": {"$first": "$position"},
                }
            },
            {"$sort": {"at": 1, "id": 1}},
            {"$limit": limit},
        ]

    async def mark_published(self, records: Sequence[OutboxRecord], *, keep: bool) -> None:
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
                    {"$group": {**by_partition, "n": {"$sum": 1}, "oldest": {"$min": "$position"}}},
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
            rows[tp] = PartitionBacklog(*tp, pending=row["n"], oldest_created_at=oldest)
        for row in failed:
            tp = (row["_id"]["topic"], row["_id"]["partition"])
            found = rows.get(tp, PartitionBacklog(*tp, pending=0, oldest_created_at=None))
            rows[tp] = replace(found, failed=row["n"])
        return [rows[tp] for tp in sorted(rows)]

    async def list_records(self, state: RecordState, limit: int) -> list[RecordInfo]:
        cursor = self.outbox.find({"state": state}).sort("_id", 1).limit(limit)
        return [_info(doc) for doc in await _guard(cursor.to_list())]

    async def retry_failed(self, event_ids: Sequence[UUID]) -> int:
        # The record keeps its position: it blocked its key, so it is still the key's oldest.
        result = await _guard(
            self.outbox.update_many(
                {"state": "failed", "event_id": {"$in": list(event_ids)}},
                {"$set": {"state": "pending", "attempts": 0}, "$unset": {"last_error": ""}},
            )
        )
        return int(result.modified_count)

    async def skip_failed(self, event_ids: Sequence[UUID]) -> int:
        result = await _guard(
            self.outbox.delete_many({"state": "failed", "event_id": {"$in": list(event_ids)}})
        )
        return int(result.deleted_count)

    async def announce_member(self, group: str, member_id: str) -> None:
        await self._presence.announce(group, member_id)

    async def departed_members(self, group: str, own_member_id: str) -> list[str]:
        return await self._presence.departed(group, own_member_id)

    async def replay(self, event_ids: Sequence[UUID]) -> int:
        """Copies with new positions: published after everything already pending of their key,
        never ahead of newer events. The event id stays, so inboxes that saw it absorb it."""

        async def copy(session: AsyncClientSession) -> int:
            kept = self.outbox.find(
                {"state": "published", "event_id": {"$in": list(event_ids)}}, session=session
            ).sort([("position", 1), ("_id", 1)])
            copies = []
            now = datetime.now(UTC)
            async for doc in kept:
                key = (doc["topic"], bytes(doc["key"]))
                span = (await take_positions(self._keys, session, {key: 1}))[key]
                copy = {k: v for k, v in doc.items() if k not in _PUBLISHED_ONLY}
                fresh = {
                    "position": span.first,
                    "previous": span.previous,
                    "created_at": now,
                    "state": "pending",
                }
                copies.append({**copy, **fresh, "attempts": 0})
            if copies:
                await self.outbox.insert_many(copies, session=session)
            return len(copies)

        return await in_transaction(self._client, copy, unavailable=StorageUnavailableError)

    # -- helpers -----------------------------------------------------------------------------

    async def _aggregate(self, pipeline: list[Document], *, hint: str) -> list[Document]:
        cursor = await self.outbox.aggregate(pipeline, hint=hint)
        return await cursor.to_list()


#: Fields of a published record that its replayed copy does not take.
_PUBLISHED_ONLY = {"_id", "published_at", "expires_at", "last_error", "attempts"}


def _split_by_size(keys: list[bytes], budget: int) -> tuple[list[bytes], list[bytes]]:
    """``keys`` as the longest prefix of at most ``budget`` bytes, and the rest."""
    used = 0
    for index, key in enumerate(keys):
        used += len(key)
        if used > budget:
            return keys[:index], keys[index:]
    return keys, []


async def _guard(operation: Awaitable[T]) -> T:
    """A server or network failure surfaces as the relay's retriable error."""
    return await guarded(operation, StorageUnavailableError)


async def _guard_snapshot(operation: Awaitable[T]) -> T:
    """As :func:`_guard`; a snapshot that cannot be read now is retriable too."""
    try:
        return await _guard(operation)
    except OperationFailure as exc:
        if exc.details is not None and exc.details.get("codeName") in _SNAPSHOT_ERRORS:
            raise StorageUnavailableError(f"MongoDB snapshot read: {exc}") from exc
        raise


def _record(doc: Document) -> OutboxRecord:
    return OutboxRecord(
        id=doc["_id"],
        topic=doc["topic"],
        partition=doc["partition"],
        key=bytes(doc["key"]),
        value=None if doc["value"] is None else bytes(doc["value"]),
        headers=tuple((str(name), bytes(value)) for name, value in doc["headers"]),
        event_id=doc["event_id"],
        attempts=doc["attempts"],
        created_at=doc["created_at"],
    )


def _info(doc: Document) -> RecordInfo:
    return RecordInfo(
        event_id=doc["event_id"],
        event_type=doc["event_type"],
        topic=doc["topic"],
        partition=doc["partition"],
        key=bytes(doc["key"]),
        state=doc["state"],
        attempts=doc["attempts"],
        created_at=doc["created_at"],
        last_error=doc.get("last_error"),
        published_at=doc.get("published_at"),
    )


def _doc_bytes(doc: Document) -> int:
    """:func:`~outboxkit.relay.limits.record_bytes` of a document, as :data:`_SIZE` on mongod."""
    value = doc["value"]
    size = len(doc["key"]) + (0 if value is None else len(value))
    return size + sum(len(str(name).encode()) + len(v) for name, v in doc["headers"])
