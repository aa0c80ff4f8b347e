"""The relay engine bounds its claims in bytes (``max_claim_bytes``, shared by the partitions a
claim reads; G8, issue #26 item 3) and drains a backlog cut short by that bound without waiting
for another wake-up or the sweep."""

from __future__ import annotations

import time

from outboxkit.relay.limits import record_bytes
from tests.unit.relay_engine_harness import MakeHarness, make, tp, until

__all__ = ["make"]  # the fixture, from relay_engine_harness (shared with test_relay_engine*.py)


async def test_claims_stay_within_their_bytes_and_a_cut_backlog_drains_at_once(
    make: MakeHarness,
) -> None:
    """20 records of one partition, 3 records' worth of bytes per claim: every claim holds at
    most the bound plus one record, every record goes out once, in order, and the backlog drains
    in claims back to back after a single wake-up, well before the 30 s sweep. Catches claims
    bounded in records only (one claim of 20) and a partition cut short by bytes left for the
    sweep."""
    probe = await make(partitions=1)
    bound = 3 * record_bytes(probe.add(0, 0, 10))
    h = await make(
        partitions=1, batch_size=500, sweep_interval=30.0, max_claim_bytes=bound, notify=False
    )
    await h.start()
    await until(lambda: tp(0) in h.storage.declared, "the relay idle, waiting for writers")
    started = time.monotonic()
    records = [h.add(0, n, n) for n in range(20)]  # 20 keys: one record each
    h.storage.signal_reconnect()  # one wake-up for them all, as one NOTIFY per transaction
    await until(lambda: len(h.broker.ids()) == 20, "every record published", within=20)
    assert time.monotonic() - started < 10, "drained without waiting for the sweep"
    assert sorted(h.broker.ids()) == [r.id for r in records], "each exactly once"
    for call in h.broker.calls:
        assert len(call.ids) <= 4, f"a claim of {len(call.ids)} records: over its bytes"
    assert h.broker.violations == []
