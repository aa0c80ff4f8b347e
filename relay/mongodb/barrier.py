"""The order barrier: a key's record goes out only right after its predecessor was settled.

Every record names its key's record before it (``previous``, :mod:`.positions`), so a key's
records form a chain with no link missing. The relay remembers, per key, the position of the last
record it settled. A record at a key's head whose ``previous`` is that position follows it
directly: it may be published. Any other record (the first of its key since this relay started or
forgot the key, one after a record another relay settled, or an operator skipped) is *checked*:
one more read asks whether an older record of the key is still pending. That read begins after
the head read ended, so it sees every transaction that had committed before any record the head
read returned, and with it every older record of the same key (same-key transactions commit in
position order). A key with an older record still pending was seen only in part — a torn read —
and is held back until the next cycle, counted in ``outboxkit_relay_order_holds`` and logged.
Within one read, a key's records must link up: the chain is cut at the first missing link.

The head read itself is a snapshot read (:mod:`.heads`), so a hold means something outside
what the relay was designed against changed: the barrier turns it into a delay, never a reorder.
A key whose first record has ``previous`` ``None`` (no position document existed) has no
predecessor: it passes without a check. Memory is bounded: past :data:`REMEMBERED` keys the
barrier starts over, which costs forgotten keys one check each.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from outboxkit.core.mongodb import Document
from outboxkit.relay.metrics import ORDER_HOLDS
from outboxkit.relay.records import OutboxRecord, TopicPartition

#: Keys (and records in flight) remembered at most; beyond, the memory starts over.
REMEMBERED = 100_000
#: Seconds after a key's settle during which a read that returns a record at or before it is
#: taken for a stale snapshot (:meth:`OrderBarrier._stale`).
STALE_WINDOW = 60.0

#: (topic, key): a key's chain; its partition is fixed at write time.
ChainKey = tuple[str, bytes]
#: Per partition, for each key to check, the position of its oldest record read: are older ones
#: of the key still pending? Returns the keys that have one.
OlderPending = Callable[[Mapping[TopicPartition, dict[bytes, int]]], Awaitable[set[ChainKey]]]

logger = structlog.get_logger("outboxkit.relay")


#: ``previous`` of a document written before the field existed: matches no settled position,
#: so it is always checked.
UNLINKED = -1


@dataclass(frozen=True, slots=True)
class Link:
    """Where a record sits in its key's chain."""

    position: int
    previous: int | None


def link_of(doc: Document) -> Link:
    return Link(int(doc["position"]), doc.get("previous", UNLINKED))


class OrderBarrier:
    def __init__(self, stale_window: float = STALE_WINDOW) -> None:
        self.stale_window = stale_window
        self._settled: dict[ChainKey, int] = {}
        #: When each key's last settle was acknowledged (:func:`time.monotonic`).
        self._settled_at: dict[ChainKey, float] = {}
        self._read: dict[object, tuple[ChainKey, int]] = {}

    def settle(self, records: Iterable[OutboxRecord]) -> None:
        """``records`` were settled (in their keys' order): remember each key's last."""
        for record in records:
            found = self._read.pop(record.id, None)
            if found is not None:
                chain, position = found
                self._settled[chain] = position
                self._settled_at[chain] = time.monotonic()
        if len(self._settled) > REMEMBERED:
            self._settled.clear()
            self._settled_at.clear()

    async def admit(
        self, records: Sequence[tuple[OutboxRecord, Link]], older_pending: OlderPending
    ) -> list[OutboxRecord]:
        """Of ``records`` (each key's in position order), the ones that may be published: each
        key's chain from its first record up to the first missing link, and none of a key with an
        older record still pending. The order of ``records`` is kept."""
        chains: dict[ChainKey, list[tuple[OutboxRecord, Link]]] = {}
        cut: set[ChainKey] = set()
        for record, link in records:
            chain_key = (record.topic, record.key)
            chain = chains.setdefault(chain_key, [])
            if chain_key in cut:
                continue
            if chain and link.previous != chain[-1][1].position:
                cut.add(chain_key)  # a missing link: nothing after it this cycle
                self._hold(record)
                continue
            chain.append((record, link))
        to_check: dict[TopicPartition, dict[bytes, int]] = {}
        stale: set[ChainKey] = set()
        for (topic, key), chain in chains.items():
            head, link = chain[0]
            if self._stale(topic, key, link):
                stale.add((topic, key))
                continue
            if link.previous is None and (topic, key) not in self._settled:
                continue  # the key's first record ever: no predecessor
            if self._settled.get((topic, key)) == link.previous:
                continue  # right after the record this relay settled last
            to_check.setdefault(TopicPartition(topic, head.partition), {})[key] = link.position
        held = await older_pending(to_check) if to_check else set()
        admitted: set[object] = set()
        for chain_key, chain in chains.items():
            if chain_key in held or chain_key in stale:
                self._hold(chain[0][0], stale=chain_key in stale)
                continue
            for record, link in chain:
                self._read[record.id] = (chain_key, link.position)
                admitted.add(record.id)
        if len(self._read) > REMEMBERED:
            self._read.clear()
        return [record for record, _ in records if record.id in admitted]

    def _stale(self, topic: str, key: bytes, link: Link) -> bool:
        """Whether the read returned a record this relay settled: the read's snapshot is older
        than the settle (a new primary's majority snapshot lags behind the writes acknowledged
        before its election, for seconds). Publishing it would put it after its key's later
        records. Only for ``stale_window`` seconds after the settle: a key whose position document
        expired (a week idle) starts its chain again at a lower position."""
        settled = self._settled.get((topic, key))
        return (
            settled is not None
            and link.position <= settled
            and time.monotonic() - self._settled_at[topic, key] < self.stale_window
        )

    def _hold(self, record: OutboxRecord, *, stale: bool = False) -> None:
        ORDER_HOLDS.labels(record.topic).inc()
        logger.warning(
            "record held back: this relay settled it already, the read is older than that"
            if stale
            else "record held back: an older record of its key is not visible yet",
            event_id=str(record.event_id),
            partition=f"{record.topic}/{record.partition}",
        )
