"""Where a record stands in its key's order on MongoDB, which has no serial column.

``ObjectId``\\ s are not in commit order (they are made by the client, before the commit, on
clocks that may disagree). So every key has a document in ``outboxkit.keys`` holding the last
*position* given to one of its records, and a writer moves it forward **inside its own
transaction**:

    position = max(server clock in µs, last position + 1)

Two transactions that write the same key both update that document, so MongoDB lets only one
of them commit; the other gets a write conflict (``TransientTransactionError``), is retried
from the start and reads the winner's position. Positions of a key therefore rise in commit
order — guarantee G2 — and the server clock makes positions of different keys roughly follow
time, so the relay reads each partition oldest first by ``(position, _id)``. A record whose
transaction commits late keeps its early position and is read from the head of its partition
like any other pending record (G3): the relay never keeps a "last position seen".

Each record also carries ``previous``: the position of its key's record just before it (the
last one of the key's previous transaction, or the one before it in the same transaction). A
key's records thus form a chain with no link missing, which the relay checks before it publishes
(the order barrier, :mod:`.barrier`): a record whose predecessor it has not seen settled is held
back until it has. ``previous`` is ``None`` for a key's first record (no document yet).

Positions of different keys may interleave, even within a millisecond (``$$NOW`` has millisecond
precision, and a transaction of ``n`` records of a key takes the ``n`` positions *below* its clock
reading): so a read that saw only part of a committed transaction would look like a key's later
records with none before them. The relay reads each head from one snapshot for that reason.

A key's document is removed by a TTL index a week after its last write. A record of that key
still pending then (the relay down for a week) has a position from the server clock at least a
week old, so the next writer's clock-based position still lies above it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pymongo import ReturnDocument, UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession

from outboxkit.core.mongodb import Collection, Document

#: The server's clock in microseconds, from inside the update (one clock for every writer).
_NOW_US = {"$multiply": [{"$toLong": "$$NOW"}, 1000]}

#: (topic, key)
Key = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class Span:
    """The positions a transaction took for one key: ``first`` to ``first + count - 1``, after
    ``previous`` (the key's last position before them; ``None`` for a new key)."""

    first: int
    previous: int | None

    def previous_of(self, index: int) -> int | None:
        """``previous`` of the span's ``index``-th record."""
        return self.previous if index == 0 else self.first + index - 1


def _advance(count: int) -> list[Document]:
    """The update that reserves ``count`` positions: the last one becomes
    max(now, previous last + count); the previous last is kept beside it."""
    last = {"$max": [_NOW_US, {"$add": [{"$ifNull": ["$position", 0]}, count]}]}
    return [
        {"$set": {"previous": {"$ifNull": ["$position", None]}}},
        {"$set": {"position": last, "updated_at": "$$NOW"}},
    ]


def _id(topic: str, key: bytes) -> Document:
    return {"topic": topic, "key": key}


def _span(doc: Document, count: int) -> Span:
    previous = doc.get("previous")
    return Span(int(doc["position"]) - count + 1, None if previous is None else int(previous))


async def take_positions(
    keys: Collection, session: AsyncClientSession, counts: Mapping[Key, int]
) -> dict[Key, Span]:
    """Reserve ``counts[k]`` consecutive positions for each key ``k``; return their span. One
    round trip for one key; two for any number (all updates in one bulk write, then one read of
    what they made — the transaction sees its own writes)."""
    fields = {"position": True, "previous": True}
    if len(counts) == 1:
        [((topic, key), count)] = counts.items()
        moved = await keys.find_one_and_update(
            {"_id": _id(topic, key)},
            _advance(count),
            projection=fields,
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        assert moved is not None  # upsert=True with ReturnDocument.AFTER always returns it
        return {(topic, key): _span(moved, count)}
    await keys.bulk_write(
        [UpdateOne({"_id": _id(*k)}, _advance(n), upsert=True) for k, n in counts.items()],
        ordered=False,
        session=session,
    )
    moved_docs = {
        (doc["_id"]["topic"], bytes(doc["_id"]["key"])): doc
        async for doc in keys.find(
            {"_id": {"$in": [_id(*k) for k in counts]}}, fields, session=session
        )
    }
    return {k: _span(moved_docs[k], n) for k, n in counts.items()}
