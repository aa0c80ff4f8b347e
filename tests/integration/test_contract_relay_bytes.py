"""The relay's storage contract, claims bounded in bytes (relay/storage.py, ``max_bytes``; G8,
issue #26 item 3): the same tests for every backend, in memory, PostgreSQL and MongoDB. Before,
a claim was bounded in records only: one held 7 records, 37.8 MB, in the relay's memory (up to
batch size x claim depth records per partition, each up to 16 MB)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from outboxkit.backends import Transactions
from outboxkit.relay import OutboxRecord, OutboxStorage, RelaySettings, TopicPartition
from outboxkit.relay.limits import record_bytes
from outboxkit.schemas import Event, partition_for_key
from tests.integration.backends import BackendCase

TOPIC = "claimbytes"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
BLOB = 100_000


class Blob(Event, type="claimbytes.blob", topic=TOPIC, key_field="entity"):
    entity: str
    seq: int
    blob: str = ""


def _keys_on(partition: int, count: int) -> list[str]:
    return [f"e{i}" for i in range(100) if partition_for_key(f"e{i}", 2) == partition][:count]


(A, B, C), (D,) = _keys_on(0, 3), _keys_on(1, 1)


@pytest.fixture
async def parts(backend_case: BackendCase) -> AsyncIterator[tuple[OutboxStorage, Transactions]]:
    settings = RelaySettings(database_url=backend_case.url, topics=[TOPIC])
    backend = backend_case.backend
    async with (
        backend.relay(settings) as (storage, _),
        backend.transactions(source="urn:test", pool_size=1, connect_timeout=5) as tx,
    ):
        await storage.register_topics({TOPIC: 2})
        yield storage, tx


def _names(records: list[OutboxRecord]) -> list[tuple[str, int]]:
    events = [Blob.model_validate_json(r.value or b"{}") for r in records]
    return sorted((e.entity, e.seq) for e in events)


async def test_a_claim_stops_adding_records_once_their_bytes_pass_the_bound(
    parts: tuple[OutboxStorage, Transactions],
) -> None:
    """Partition 0 gets five 100 KB records (commit order A0 B0 A1 C0 B1), partition 1 one.
    With a bound of 250 KB, partition 0 returns records while the bytes before them are under
    it — A0, B0, A1 (300 KB, at least the bound: the relay can tell it was cut) — each key a
    prefix of its records; partition 1 its own. A bound below one record still returns each
    partition's first (a big record moves). Settling moves on to the rest. Catches a claim
    bounded in records only, a bound that starves a large record, a cut that skips a record of
    a key."""
    storage, tx = parts
    order = [(A, 0), (B, 0), (A, 1), (C, 0), (B, 1)]
    async with tx.transaction() as t:
        for entity, seq in order:
            await tx.outbox.add(t, Blob(entity=entity, seq=seq, blob="x" * BLOB))
        await tx.outbox.add(t, Blob(entity=D, seq=0))

    everything = await storage.next_batch([TP0, TP1], 10, depth=3)
    assert len(everything) == 6, "no bound: every record"
    assert all(BLOB < record_bytes(r) < BLOB + 1000 for r in everything if r.partition == 0)

    bound = 250_000
    claimed = await storage.next_batch([TP0, TP1], 10, depth=3, max_bytes=bound)
    assert _names(claimed) == sorted([(A, 0), (B, 0), (A, 1), (D, 0)])
    on_p0 = sum(record_bytes(r) for r in claimed if r.partition == 0)
    assert on_p0 >= bound, "a partition cut short returns at least the bound"

    tiny = await storage.next_batch([TP0, TP1], 10, depth=3, max_bytes=1)
    assert _names(tiny) == sorted([(A, 0), (D, 0)]), "always each partition's first record"

    rest = await storage.next_batch([TP0], 10, published=claimed, depth=3, max_bytes=bound)
    assert _names(rest) == sorted([(C, 0), (B, 1)])
