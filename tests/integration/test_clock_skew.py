"""Workers whose clocks are wrong (issue #41): an inbox worker run under libfaketime (Debian's
``faketime``), its clock moved +45 s or -45 s, against servers on the real clock.

The inbox's dedupe records count for ``inbox_retention``: a duplicate arriving within it must be
absorbed (G6) whatever the clock of the worker that wrote the record and of the one that reads
it. Here the retention is 30 s, shorter than the skew, so a decision taken on a worker's own
clock shows at once: a fast worker (+45 s) would think a record written a few seconds ago by a
correct one had expired, and a slow one (-45 s) would write records already expired for
everyone else.

Only the wall clock is moved (``FAKETIME_DONT_FAKE_MONOTONIC=1``): timeouts, intervals and the
event loop run on the monotonic clock, which a skewed host keeps anyway.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.failover.harness import FailoverRun
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    wait_caught_up,
)

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

#: Shorter than the skew: a worker that judged expiry on its own clock would be caught.
RETENTION = 30


def skewed(offset: str) -> dict[str, str]:
    """The environment that moves a process's wall clock by ``offset`` (``+45s``)."""
    if not LIBFAKETIME.exists():
        pytest.fail(
            f"{LIBFAKETIME} is missing: apt-get install faketime (.ci/run does)", pytrace=False
        )
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@pytest.mark.slow
async def test_a_skewed_inbox_worker_never_takes_a_duplicate_twice(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Events are handled by one worker, then delivered again (a relay's re-delivery, a
    replay) to the next one, a few seconds later, well within the retention: a correct worker
    after a fast one, a fast one (+45 s) after a correct one, a correct one after a slow one
    (-45 s). Would catch a worker that decides a dedupe record has expired by its own clock,
    or writes its expiry by its own clock: an event handled twice (G6)."""
    topic = await make_topic("skew", partitions=1)
    await make_topic(name=f"{topic}.dlq")
    await create_effects_table(db_url)
    env = inbox_env(db_url, kafka_bootstrap, topic, OUTBOXKIT_INBOX_RETENTION=f"{RETENTION}")
    phases = [("-45s", ""), ("", "+45s")]
    for round_, (first, then) in enumerate(phases):
        events = [Payment(topic=topic, entity=f"r{round_}-{i}", seq=i) for i in range(5)]
        for clock in (first, then):
            # Each worker gets the same events: the second time they are duplicates.
            extra = skewed(clock) if clock else {}
            worker = InboxProcess(tmp_path, {**env, **extra}).start()
            try:
                await produce(kafka_bootstrap, events)
                await wait_caught_up(
                    kafka_bootstrap,
                    group_of(topic),
                    topic,
                    1,
                    within=30,
                    what=f"the inbox worker (clock {clock or 'real'}) to catch up",
                    interval=0.2,
                )
            finally:
                assert worker.terminate() == 0, worker.log()
        taken = collections.Counter(event_id for event_id, _, _ in await effects(db_url))
        twice = {str(e.id)[:8]: taken[e.id] for e in events if taken[e.id] != 1}
        assert not twice, (
            f"G6 violated: a worker on {then or 'the real clock'} after one on "
            f"{first or 'the real clock'} took these events' effects again (count): {twice}"
        )


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(120)
async def test_relays_and_inbox_workers_on_skewed_clocks(
    db_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Three relays, on clocks +45 s, real and -45 s, and two inbox workers, +45 s and -45 s,
    under a steady load; the relay on the real clock is SIGKILLed, so the skewed ones take its
    partitions over (presence, leases, stall checks all run on skewed clocks). Would catch a
    decision on a worker's own clock that loses, reorders or doubles an event (G1, G2, G6),
    lets two relays publish a partition (G4), or leaves a worker unhealthy (a stall or a
    staleness judged by a clock 45 s off)."""
    async with FailoverRun(
        db_url,
        kafka_bootstrap,
        tmp_path,
        partitions=4,
        relays=3,
        inboxes=2,
        rate=100.0,
        entities=12,
        recovery_timeout=60.0,
        worker_env={
            "relay-0": skewed("+45s"),
            "relay-2": skewed("-45s"),
            "inbox-0": skewed("+45s"),
            "inbox-1": skewed("-45s"),
        },
    ) as run:
        async with run.fault("the relay on the real clock SIGKILLed") as fault:
            fault.detail = "relay-1; relays +45 s and -45 s remain"
            relay_1 = run.workers[1]
            relay_1.process.kill()
        run.workers.remove(relay_1)  # killed on purpose: not a health problem
        report = await run.finish()
    print(f"\n{report}")
    # Guarantees, health and the return to baseline; of the gaps commit→Kafka, which this
    # process's own clock measures, and Kafka→effect, the database server's (the send time is a
    # skewed relay's CreateTime: not judged).
    assert report.ok, str(report)
    assert all(g.delivery < 20.0 and g.inbox < 20.0 for g in report.faults), str(report)
