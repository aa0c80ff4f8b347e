"""outboxkit on a PostgreSQL primary with a synchronous streaming standby, every writer,
relay and inbox worker on the multi-host URL (``target_session_attrs=read-write``): 2 relays
and an inbox worker of 24 partitions under a steady load while the primary crashes and restarts,
is switched over to the standby (a clean shutdown, then ``pg_ctl promote``) and is SIGKILLed
with the standby promoted 2 s later, one after the other on one pair (the former primary rejoins
as the standby after the switchover). Afterwards G1, G2, G4 and G6 hold on what Kafka and the
database hold, every process is healthy again without a restart and logged no traceback, no
fault held events back longer than ``MAX_GAP``, and after each the delays were back to the
window before it (:mod:`tests.failover.baseline`) — at a quiet load after the crash and the
promotion, where a relay that writers no longer wake shows: it publishes on its sweep.

The harness is :mod:`tests.failover`, the faults :mod:`tests.failover.postgres_faults`;
``bench/failover.py`` runs the same scenarios."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from outboxkit.embedded.postgres import ReplicatedPostgres
from tests.failover.harness import FailoverRun
from tests.failover.postgres_faults import POSTGRES_FAULTS
from tests.integration.conftest import migrate_database

#: Longest commit→Kafka or Kafka→effect delay a fault may cause on this noisy 2-core machine:
#: the promotion (2 s after the kill) plus a few seconds.
MAX_GAP = 20.0

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(300)]


async def test_crash_restart_switchover_and_promotion_of_the_primary(
    replicated_postgres_factory: Callable[..., ReplicatedPostgres],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    """Would catch an event lost or reordered across a promotion (an acknowledged commit the
    standby did not have), two publishers of a partition (G4), an effect taken twice (G6), a
    worker that stays on the old primary or unhealthy, a relay that writers no longer wake
    after the database lost its idle declarations (a quiet window at the sweep interval), and
    pooled connections that keep a worker idle after the database answers again."""
    pair = await asyncio.to_thread(replicated_postgres_factory)
    await asyncio.to_thread(pair.primary.execute, "CREATE DATABASE shop")
    url = pair.url("shop")
    await migrate_database(url)
    async with FailoverRun(
        url,
        kafka_bootstrap,
        tmp_path,
        relays=2,
        inboxes=1,
        rate=50.0,
        partitions=24,
        entities=96,
        concurrent_writers=8,
    ) as run:
        for scenario in POSTGRES_FAULTS.values():
            await scenario(run, pair)
        report = await run.finish()
    print(f"\n{report}")
    report.assert_ok(max_gap=MAX_GAP)
    # Quiet: back means its p50 too, within twice the baseline's or under QUIET_P50 (100 ms).
    assert [f.load for f in report.faults] == ["quiet", "busy", "quiet"]
