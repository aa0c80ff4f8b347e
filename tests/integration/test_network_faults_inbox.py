"""An inbox worker's Kafka link broken while its database stays reachable (issue #41), with
Toxiproxy between it and the broker (tests/network): half-open, cut, connections reset. The
group moves its partitions to the other worker, which reads again what this one had handled but
not committed the offsets of, while this one may still be handling it. Afterwards G1, G2, G4 and
G6 are checked on what Kafka and the database hold (tests/failover), every process is healthy
again without a restart, and the gap is printed and bounded. The relay's links and the
database links are test_network_faults.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.network.fixtures import Links
from tests.network.workers import (
    INBOXES,
    MAX_GAP,
    RESETS,
    Steps,
    assigned_to,
    metric,
    network_run,
    reset_repeatedly,
    taken_effect,
)
from tests.timeouts import SESSION_TIMEOUT

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.timeout(120)]


async def test_inbox_kafka_link_half_open_cut_and_reset(
    db_url: str, kafka_links: Links, tmp_path: Path
) -> None:
    """inbox-0 reaches Kafka through LINK0, inbox-1 directly; both reach the database. In turn
    the link is made half-open, cut, and reset again and again. Each time inbox-0 has handled
    records whose offsets it has not committed yet (it commits every
    OUTBOXKIT_COMMIT_INTERVAL): the group gives its partitions to inbox-1, which reads them
    again from the last committed offset while inbox-0 may still be handling what it had
    fetched — the same events in two workers at once, each in a database transaction of its
    own. Would catch an effect taken twice (G6: the dedupe record not deciding between two
    concurrent transactions, or an offset committed ahead of its database commit) or never, an
    event lost or reordered, or an inbox worker that hangs on a dead socket for good or does
    not take partitions again once the link heals."""
    link = kafka_links.proxies[0]
    async with network_run(
        db_url,
        kafka_links.bootstrap,
        tmp_path,
        relays=1,
        inboxes=2,
        worker_env={"inbox-0": {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": link.listen}},
    ) as run:
        inbox_0, inbox_1 = (next(w for w in run.workers if w.name == n) for n in INBOXES)
        took: dict[str, float] = {}
        duplicates = await metric(inbox_1, "outboxkit_inbox_duplicates_total")
        for name, cut in [("half-open", link.half_open), ("cut", link.disable)]:
            await wait_for(
                lambda: assigned_to(inbox_0, 1), within=60, interval=0.2, what="inbox-0 in"
            )
            async with run.fault(f"inbox-0's Kafka link {name}") as fault:
                fault.detail = "LINK0 " + ("timeout=0 both ways" if name == "half-open" else "off")
                fault.detail += ", until inbox-1 took effect of everything committed meanwhile"
                await cut()
                steps = Steps(took, name, time.time())
                await steps.until(
                    "partitions moved",
                    lambda: assigned_to(inbox_1, 4),
                    within=SESSION_TIMEOUT + 20,
                    what="inbox-1 holding every partition",
                )
                await taken_effect(run, time.time(), within=30)
                await link.heal()
                await steps.until(
                    "inbox-0 back",
                    lambda: assigned_to(inbox_0, 1),
                    within=60,
                    what="inbox-0 holding partitions again",
                )
        async with run.fault("inbox-0's Kafka link reset") as fault:
            # Fetches and offset commits cut in flight: an offset commit whose outcome inbox-0
            # never learnt is retried or left to the next; its records are absorbed if read again.
            fault.detail = f"reset_peer {RESETS} times, each once inbox-0 had handled again"
            handled = await reset_repeatedly(link, inbox_0, "outboxkit_inbox_handled_total")
        duplicates = await metric(inbox_1, "outboxkit_inbox_duplicates_total") - duplicates
        report = await run.finish()
    print(f"\n{report}\nseconds after the fault: {took}")
    print(f"inbox-1 absorbed {duplicates:g} duplicates; inbox-0 handled {handled} between resets")
    report.assert_ok(max_gap=MAX_GAP)
