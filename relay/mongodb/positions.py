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

A key's document is removed by a TTL index a week after its last write. A record of that key
still pending then (the relay down for a week) has a position from the server clock at least a
week old, so the next writer's clock-based position still lies above it.
"""

from __future__ import annotations

from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession

from outboxkit.core.mongo import Collection

#: The server's clock in microseconds, from inside the update (one clock for every writer).
_NOW_US = {"$multiply": [{"$toLong": "$$NOW"}, 1000]}


async def take_positions(
    keys: Collection, session: AsyncClientSession, topic: str, key: bytes, count: int
) -> int:
    """Reserve ``count`` consecutive positions for ``key`` of ``topic``; return the first."""
    moved = await keys.find_one_and_update(
        {"_id": {"topic": topic, "key": key}},
        [
            {
                "$set": {
                    "position": {
                        "$max": [_NOW_US, {"$add": [{"$ifNull": ["$position", 0]}, count]}]
                    },
                    "updated_at": "$$NOW",
                }
            }
        ],
        projection={"position": True},
        upsert=True,
        return_document=ReturnDocument.AFTER,
        session=session,
    )
    assert moved is not None  # upsert=True with ReturnDocument.AFTER always returns it
    return int(moved["position"]) - count + 1
