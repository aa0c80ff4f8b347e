"""Relays publish what services write: transactions of several events per key (issue #32).

Writers commit transactions of 1-12 events on each of 1-3 keys, other keys interleaved within
the transaction, with ``add`` and ``add_many``, while two relay processes publish them; the
topic, read back, must hold every committed event, each key's first appearances in commit order
(G1, G2). A key's events are written by one writer task, so their commit order is its write
order. On MongoDB the server yields at every document, so that head reads often run while
transactions commit. This end-to-end shape did not catch the torn read of 4bac9f4 in the run
tried (it needs a commit inside the scan's range); ``test_mongodb_order.py`` does, every time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from outboxkit.backends import Transactions, backend_for
from tests.integration.conftest import MakeTopic, migrate_mongodb_database
from tests.integration.relay_harness import (
    Step,
    Writers,
    check_guarantees,
    read_topic,
    register_topic,
    relay_env,
    relays,
    wait_pending,
)
from tests.integration.test_mongodb_order import YIELD_ALWAYS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PARTITIONS = 3
ENTITIES = 24
WRITERS = 4
TRANSACTIONS = 120  # per writer task


@pytest.fixture(params=["postgresql", "mongodb"])
def busy_db_url(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("migrated_postgresql_url"))
    mongo_factory: Callable[..., Any] = request.getfixturevalue("mongo_factory")
    url = str(mongo_factory(parameters=YIELD_ALWAYS).url("many"))
    asyncio.run(migrate_mongodb_database(url))
    return url


async def _write(
    tx: Transactions, topic: str, entities: list[str], ledger: Writers, rng: random.Random
) -> None:
    seqs = dict.fromkeys(entities, 0)
    for _ in range(TRANSACTIONS):
        chosen = rng.sample(entities, rng.randint(1, 3))
        events: list[Step] = []
        for entity in chosen:
            count = rng.randint(1, 12)
            events += [Step(topic=topic, entity=entity, seq=seqs[entity] + i) for i in range(count)]
            seqs[entity] += count
        # Keys interleaved within the transaction, each key's events still in order.
        rng.shuffle(events)
        mixed = _keep_key_order(events)
        one_by_one = rng.random() < 0.5

        async def work(t: Any, mixed: list[Step] = mixed, one_by_one: bool = one_by_one) -> None:
            if one_by_one:
                for event in mixed:
                    await tx.outbox.add(t, event)
            else:
                await tx.outbox.add_many(t, mixed)

        await tx.run(work)
        for event in mixed:
            ledger.committed[event.entity].append(event.id)
            ledger.seq_of[event.id] = (event.entity, event.seq)


def _keep_key_order(events: list[Step]) -> list[Step]:
    """``events`` in the given interleaving of keys, each key's events in sequence order."""
    by_key: dict[str, list[Step]] = {}
    for event in sorted(events, key=lambda e: e.seq):
        by_key.setdefault(event.entity, []).append(event)
    return [by_key[event.entity].pop(0) for event in events]


async def test_transactions_of_many_events_per_key_reach_kafka_in_commit_order(
    busy_db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    url = busy_db_url
    topic = await make_topic("many", partitions=PARTITIONS)
    await register_topic(url, topic, PARTITIONS)
    ledger = Writers(url, topic)  # only its record of what committed
    names = [f"entity-{i}" for i in range(ENTITIES)]
    env = relay_env(url, kafka_bootstrap, topic, OUTBOXKIT_CLAIM_DEPTH="4")
    backend = backend_for(url)
    with relays(tmp_path, env, count=2):
        async with backend.transactions(
            source="urn:test", pool_size=WRITERS, connect_timeout=5
        ) as tx:
            await asyncio.gather(
                *(
                    _write(tx, topic, names[w::WRITERS], ledger, random.Random(w))
                    for w in range(WRITERS)
                )
            )

        await wait_pending(url, within=90)
        published = await read_topic(kafka_bootstrap, topic, PARTITIONS)
    summary = check_guarantees(ledger, published)  # G1 and G2, asserted inside
    assert ledger.total >= WRITERS * TRANSACTIONS, summary  # every transaction added events
