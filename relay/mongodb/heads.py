"""The claim's read on MongoDB: which pending records head each partition, read whole.

One job, in two reads whatever the number of partitions: one command chooses every partition's
head and reads the keys a failed record blocks, all from one snapshot (:func:`heads_pipeline`);
then the chosen documents are read within the claim's byte bound. And the order barrier's check
(:meth:`HeadReader.older_pending`): is an older record of a key still pending?

The head of a partition is chosen by mongod from ``outbox_head_idx`` alone, a partial index that
holds pending records only, by ``(topic, partition, position, _id, key)``: the choice stays an
index range scan however many published or failed records the collection keeps, and only the
chosen documents are read. It is a **snapshot read** (a point in time of majority-committed
data): an ordinary read yields every so often and resumes on a newer snapshot, so a transaction
that committed meanwhile shows only the records past the scan's position, and a key's later
records looked like its head (seq 12-15 were once published before 8-11 of one transaction).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from pymongo.errors import OperationFailure, PyMongoError

from outboxkit.core.mongodb import PREFIX, Client, Document, guarded, is_unavailable
from outboxkit.core.mongodb import Collection as MongoCollection
from outboxkit.relay.exceptions import StorageUnavailableError
from outboxkit.relay.mongodb.barrier import ChainKey, Link, link_of
from outboxkit.relay.records import OutboxRecord, TopicPartition

T = TypeVar("T")

#: The head's choice reads this many records per record it may return: with repeated keys near the
#: head, a wider window still fills the batch with distinct keys.
SCAN_FACTOR = 4
#: Bytes of held keys the head read's ``$nin`` carries at most (mongod's commands are limited
#: to 16 MB; keys are at most 4 KiB, relay/limits.py): beyond, keys are dropped after the read.
HELD_IN_QUERY = 1_000_000
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
#: The outbox collection's name (heads_pipeline's $unionWith names it).
OUTBOX = PREFIX + "outbox"
#: The partial index of failed records (migrations/files/mongodb/0001): the held keys' read.
FAILED_INDEX = "outbox_failed_idx"

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


class HeadReader:
    """Reads the heads of partitions from ``outbox`` (the claim's read; nothing is written)."""

    #: Head reads are snapshot reads (see the module's docstring). A test turns this off to
    #: show that the order barrier alone still keeps a key's order.
    snapshot = True

    def __init__(
        self, client: Client, outbox: MongoCollection, held_in_query: int = HELD_IN_QUERY
    ) -> None:
        self.held_in_query = held_in_query
        self._client = client
        self.outbox = outbox
        #: Per partition, the keys the last read found held (the next read leaves them out).
        self._held: dict[TopicPartition, list[bytes]] = {}

    async def read(
        self,
        tps: Collection[TopicPartition],
        limit: int,
        *,
        depth: int,
        max_bytes: int | None,
        settling: Mapping[TopicPartition, list[Any]] | None = None,
    ) -> list[tuple[OutboxRecord, Link]]:
        """Of each partition of ``tps``, at most ``limit`` keys, oldest key first, each with its
        ``depth`` oldest pending records in order (none skipped), keys a failed record blocks
        left out; with ``max_bytes``, of each partition only those while the bytes before them
        stay under it (always the first). Each with its link in its key's chain. ``settling``:
        per partition, the ``_id``\\ s of records being settled meanwhile, left out.

        Two round trips: the choice (:meth:`choose_heads`), then the chosen documents."""
        if not tps:
            return []
        heads = await self.choose_heads(list(tps), limit, depth, settling=settling)
        ids = [record_id for head in heads for record_id in head["ids"]]
        if not ids:
            return []
        by_id = {doc["_id"]: doc for doc in await self._documents(ids, max_bytes)}
        # A record the CLI skipped or retried meanwhile is simply not there.
        return [(_record(by_id[i]), link_of(by_id[i])) for i in ids if i in by_id]

    async def choose_heads(
        self,
        tps: list[TopicPartition],
        limit: int,
        depth: int,
        *,
        settling: Mapping[TopicPartition, list[Any]] | None = None,
    ) -> list[Document]:
        """Each partition's head, partition by partition in the order of ``tps``: key by key,
        oldest key first, each key's ``{"_id": key, "ids": [...]}`` oldest first
        (:func:`head_pipeline`), held keys and ``settling``'s records left out.

        One command (:func:`heads_pipeline`) reads, from one snapshot, the keys a failed record
        holds and every partition's head. The head's window leaves out, in the query, the keys
        the last read found held (a read would otherwise fill with parked records): a partition
        whose held keys changed since is read once more with the new ones, and a key found held
        is never returned whatever the query left out."""
        read = functools.partial(
            self._heads_and_held,
            limit=limit,
            depth=depth,
            settling=settling or {},
        )
        left_out = self._left_out(tps)
        heads, held = await read(tps, left_out)
        self._remember(tps, held)
        now_left_out = self._left_out(tps)
        changed = [tp for tp in tps if set(now_left_out.get(tp, ())) != set(left_out.get(tp, ()))]
        if changed:
            again, held_again = await read(
                changed, {tp: now_left_out.get(tp, []) for tp in changed}
            )
            heads.update({tp: again.get(tp, []) for tp in changed})
            held.update({tp: held_again.get(tp, []) for tp in changed})
            self._remember(changed, held)
        chosen: list[Document] = []
        for tp in tps:
            blocked = set(held.get(tp, ()))
            chosen += (head for head in heads.get(tp, []) if bytes(head["_id"]) not in blocked)
        return chosen

    def _remember(
        self, tps: list[TopicPartition], held: Mapping[TopicPartition, list[bytes]]
    ) -> None:
        for tp in tps:
            if held.get(tp):
                self._held[tp] = held[tp]
            else:
                self._held.pop(tp, None)

    def _left_out(self, tps: list[TopicPartition]) -> dict[TopicPartition, list[bytes]]:
        """Per partition, the held keys the head read's ``$nin`` carries: the last read's, at
        most ``held_in_query`` bytes of them in all (mongod refuses a command over 16 MB)."""
        budget, left_out = self.held_in_query, {}
        for tp in tps:
            in_query, _ = split_by_size(self._held.get(tp, []), budget)
            if in_query:
                left_out[tp] = in_query
                budget -= sum(map(len, in_query))
        return left_out

    async def _heads_and_held(
        self,
        tps: list[TopicPartition],
        left_out: Mapping[TopicPartition, list[bytes]],
        *,
        limit: int,
        depth: int,
        settling: Mapping[TopicPartition, list[Any]],
    ) -> tuple[dict[TopicPartition, list[Document]], dict[TopicPartition, list[bytes]]]:
        pipeline = heads_pipeline(tps, left_out, limit, depth, settling=settling)
        async with self._client.start_session(
            snapshot=self.snapshot, causal_consistency=False
        ) as session:
            cursor = await _guard_snapshot(
                self.outbox.aggregate(pipeline, hint=FAILED_INDEX, session=session)
            )
            found = await _guard_snapshot(cursor.to_list())
        heads: dict[TopicPartition, list[Document]] = {}
        held: dict[TopicPartition, list[bytes]] = {}
        for doc in found:
            if "held" in doc:
                where = doc["held"]
                tp = TopicPartition(where["topic"], where["partition"])
                held.setdefault(tp, []).append(bytes(where["key"]))
            else:
                heads.setdefault(tps[doc.pop("tp")], []).append(doc)
        return heads, held

    async def older_pending(self, keys: Mapping[TopicPartition, dict[bytes, int]]) -> set[ChainKey]:
        """The keys of ``keys`` with a pending record older than the given position (the order
        barrier's check), one read per partition (:func:`older_pending_query`)."""

        async def of(tp: TopicPartition, positions: dict[bytes, int]) -> set[ChainKey]:
            where, fields = older_pending_query(tp, positions)
            found = self.outbox.find(where, fields, hint=HEAD_INDEX)
            return {
                (tp.topic, bytes(doc["key"]))
                for doc in await _guard(found.to_list())
                if doc["position"] < positions[bytes(doc["key"])]
            }

        found = await asyncio.gather(*(of(tp, positions) for tp, positions in keys.items()))
        return set().union(*found)

    async def _documents(self, ids: list[Any], max_bytes: int | None) -> list[Document]:
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
                size[tp] = size.get(tp, 0) + doc_bytes(doc)
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
        return await self._bounded_documents(ids, max_bytes)

    async def _bounded_documents(self, ids: list[Any], max_bytes: int) -> list[Document]:
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


def heads_pipeline(
    tps: list[TopicPartition],
    left_out: Mapping[TopicPartition, list[bytes]],
    limit: int,
    depth: int,
    *,
    settling: Mapping[TopicPartition, list[Any]] | None = None,
) -> list[Document]:
    """One aggregate for a whole claim's choice: the keys a failed record holds in ``tps``
    (``{"held": {topic, partition, key}}``, read from outbox_failed_idx, the command's hint),
    then each partition's head (:func:`head_pipeline`, leaving out ``left_out``'s keys and
    ``settling``'s records), each output document tagged with its partition's index in ``tps``
    (``tp``). In one command every part reads the same snapshot, and the choice costs one round
    trip, not one per partition and another for the held keys. A ``$unionWith`` sub-pipeline
    takes no hint: outbox_head_idx is the only index whose partial filter serves it
    (test_claim_plans.py checks the plan).

    The records themselves are read by ``_id`` afterwards (:meth:`HeadReader._documents`): a
    ``$lookup`` of them in this command saved that round trip but cost mongod more than it
    saved, 2.5 against 1.4 ms of CPU for a claim of 18 records and 174 against 24 ms for
    4,000."""
    where = [{"topic": tp.topic, "partition": tp.partition} for tp in tps]
    settling = settling or {}
    return [
        {"$match": {"state": "failed", "$or": where}},
        {"$group": {"_id": {"topic": "$topic", "partition": "$partition", "key": "$key"}}},
        {"$sort": {"_id": 1}},
        {"$project": {"_id": False, "held": "$_id"}},
        *(
            {
                "$unionWith": {
                    "coll": OUTBOX,
                    "pipeline": [
                        *head_pipeline(
                            tp, left_out.get(tp, []), limit, depth, skip=settling.get(tp, [])
                        ),
                        {"$set": {"tp": index}},
                    ],
                }
            }
            for index, tp in enumerate(tps)
        ),
    ]


def head_pipeline(
    tp: TopicPartition, held: list[bytes], limit: int, depth: int = 1, *, skip: Sequence[Any] = ()
) -> list[Document]:
    """The choice of ``tp``'s head, made by mongod from outbox_head_idx alone (a covered
    read: every field it uses is in the index, no document is fetched): the first
    ``4 * limit`` pending records in position order (an index range scan, no sort: the
    index is in order; held keys left out so that they do not crowd the window); of
    each key among them its ``depth`` oldest, in order (``$firstN`` keeps the scan's order:
    a prefix of the key's pending records, none skipped, since a key's records commit in
    position order); the ``limit`` keys whose oldest record comes first. ``skip``: the
    ``_id``\\ s of records being settled meanwhile (still pending in what this read may see)."""
    match: Document = {"topic": tp.topic, "partition": tp.partition, "state": "pending"}
    if held:
        match["key"] = {"$nin": held}
    if skip:
        match["_id"] = {"$nin": list(skip)}
    return [
        {"$match": match},
        {"$sort": {"position": 1, "_id": 1}},
        {"$limit": limit * SCAN_FACTOR},
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


def older_pending_query(
    tp: TopicPartition, positions: Mapping[bytes, int]
) -> tuple[Document, Document]:
    """Filter and projection of the pending records of ``positions``' keys below the newest
    position asked about: a covered range scan of outbox_head_idx over the head's window,
    where those records were read."""
    where = {
        "topic": tp.topic,
        "partition": tp.partition,
        "state": "pending",
        "position": {"$lt": max(positions.values())},
        "key": {"$in": list(positions)},
    }
    return where, {"_id": False, "key": True, "position": True}


def split_by_size(keys: list[bytes], budget: int) -> tuple[list[bytes], list[bytes]]:
    """``keys`` as the longest prefix of at most ``budget`` bytes, and the rest."""
    used = 0
    for index, key in enumerate(keys):
        used += len(key)
        if used > budget:
            return keys[:index], keys[index:]
    return keys, []


def doc_bytes(doc: Document) -> int:
    """:func:`~outboxkit.relay.limits.record_bytes` of a document, as :data:`_SIZE` on mongod."""
    value = doc["value"]
    size = len(doc["key"]) + (0 if value is None else len(value))
    return size + sum(len(str(name).encode()) + len(v) for name, v in doc["headers"])


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
