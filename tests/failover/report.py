"""What a failover run measured and checked: per fault, the longest delays, and once for the
run, the guarantees and the processes' health — as data (for asserts) and as one table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from uuid import UUID

from tests.failover.arrivals import Arrival

#: Events committed this long before a fault started count towards it (in flight when it hit).
BEFORE = 1.0


@dataclass
class Fault:
    """One fault: from when it was injected to when the server was back (``ended``) and the
    pipeline had caught up again (``recovered``). ``detail`` says what was done to which
    server (e.g. ``SIGKILL node 2, leader of t/3``)."""

    name: str
    started: float
    ended: float = 0.0
    recovered: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Gaps:
    """Over the events committed from just before ``started`` until ``recovered``, the longest
    delays: commit→Kafka (``delivery``: until a ``read_committed`` reader got it), of which
    commit→the relay's send (``sent``: the record's CreateTime), Kafka→the inbox's effect
    (``inbox``), and commit→effect (``end_to_end``)."""

    name: str
    detail: str
    events: int
    delivery: float
    sent: float
    inbox: float
    end_to_end: float
    #: Seconds from the fault's start until every earlier commit had reached Kafka and taken
    #: effect.
    recovery: float
    #: The most delayed event: its partition and when it was committed, from the fault's start.
    worst: str = ""
    #: The 99th percentile of the commit→Kafka delays (``delivery`` is their maximum).
    delivery_p99: float = 0.0


def gaps(
    fault: Fault,
    committed_at: Mapping[UUID, float],
    arrivals: Mapping[UUID, Arrival],
    effect_at: Mapping[UUID, float],
) -> Gaps:
    window = [
        e for e, at in committed_at.items() if fault.started - BEFORE <= at <= fault.recovered
    ]
    arrived = [e for e in window if e in arrivals]
    effective = [e for e in window if e in effect_at]
    delays = sorted(arrivals[e].at - committed_at[e] for e in arrived)
    worst = ""
    if arrived:
        slowest = max(arrived, key=lambda e: arrivals[e].at - committed_at[e])
        worst = (
            f"p{arrivals[slowest].partition} committed at "
            f"{committed_at[slowest] - fault.started:+.1f} s"
        )
    return Gaps(
        fault.name,
        fault.detail,
        len(window),
        delivery=max((arrivals[e].at - committed_at[e] for e in arrived), default=0.0),
        sent=max((arrivals[e].sent - committed_at[e] for e in arrived), default=0.0),
        inbox=max(
            (max(0.0, effect_at[e] - arrivals[e].at) for e in effective if e in arrivals),
            default=0.0,
        ),
        end_to_end=max((effect_at[e] - committed_at[e] for e in effective), default=0.0),
        recovery=fault.recovered - fault.started,
        worst=worst,
        delivery_p99=delays[min(len(delays) - 1, int(len(delays) * 0.99))] if delays else 0.0,
    )


@dataclass
class Report:
    faults: list[Gaps] = field(default_factory=list)
    #: Guarantee → (held, what was checked or how it failed).
    guarantees: dict[str, tuple[bool, str]] = field(default_factory=dict)
    #: What was wrong with the processes at the end (dead, unhealthy, a traceback logged).
    health: list[str] = field(default_factory=list)
    #: How many events the writers committed, and how fast.
    load: str = ""

    @property
    def ok(self) -> bool:
        return all(held for held, _ in self.guarantees.values()) and not self.health

    def lines(self) -> list[str]:
        out = [
            f"load: {self.load}",
            "| fault | what | events | delivery gap s (to send) | p99 s | inbox gap s "
            "| commit→effect s | recovered after s | most delayed |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        out += [
            f"| {g.name} | {g.detail} | {g.events} | {g.delivery:.2f} ({g.sent:.2f}) "
            f"| {g.delivery_p99:.2f} "
            f"| {g.inbox:.2f} | {g.end_to_end:.2f} | {g.recovery:.1f} | {g.worst} |"
            for g in self.faults
        ]
        out += [
            f"{name}: {'held' if held else 'VIOLATED'} ({text})"
            for name, (held, text) in self.guarantees.items()
        ]
        out.append("health: " + ("; ".join(self.health) or "every process healthy, no traceback"))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def assert_ok(self, *, max_gap: float) -> None:
        """Every guarantee held, every process is healthy, and no fault's delivery or inbox
        gap exceeded ``max_gap`` seconds."""
        assert self.ok, str(self)
        slow = [g for g in self.faults if max(g.delivery, g.inbox) > max_gap]
        assert not slow, f"gaps over {max_gap} s:\n{self}"
