"""Stepping aside (core/step_aside.py), the one part the relay and the inbox worker share: as an
inbox uses it, with no progress clock — its transactions failing is the database not
answering. The relay's use, on its backlog monitor's clock, is in test_relay_side_tasks.py."""

from __future__ import annotations

import structlog

from outboxkit.core.step_aside import StepAside


class Group:
    def __init__(self) -> None:
        self.steps: list[str] = []

    async def step_aside(self) -> None:
        self.steps.append("aside")

    def step_in(self) -> None:
        self.steps.append("in")


async def test_a_worker_leaves_after_the_bound_once_and_joins_again_at_the_first_answer() -> None:
    """Would catch a worker that leaves before the bound, leaves twice, stays out once its
    database answers, or leaves at all with the bound at 0 (never)."""
    failing: list[float | None] = [None]
    gauge: list[float] = []
    group = Group()
    aside = StepAside(
        lambda: failing[0],
        group,
        3.0,
        others="the other workers handle this worker's partitions",
        gauge=gauge.append,
        log=structlog.get_logger("outboxkit.inbox"),
    )
    failing[0] = 2.9
    assert not aside.due()
    await aside.check()
    failing[0] = 3.0
    assert aside.due()
    with structlog.testing.capture_logs() as logs:
        await aside.check()
        await aside.check()  # still failing, already out
    assert group.steps == ["aside"]
    assert [e["event"] for e in logs] == [
        "the database does not answer: leaving the group so that the other workers handle this "
        "worker's partitions"
    ]
    assert aside.aside_for() is not None
    assert not aside.due()
    failing[0] = None  # a ping answered
    await aside.check()
    assert (group.steps, gauge, aside.aside_for()) == (["aside", "in"], [1, 0], None)

    never = StepAside(lambda: 1e9, group, 0.0, others="", gauge=gauge.append, log=None)
    assert not never.due()
