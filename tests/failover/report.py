"""What a failover run measured and checked: per fault, the longest delays, and once for the
run, the guarantees and the processes' health — as data (for asserts) and as one table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID

from tests.failover.arrivals import Arrival
from tests.failover.baseline import Window

#: Events committed this long before a fault started count towards it (in flight when it hit).
BEFORE = 1.0


#: The load a fault runs under: the run's rate, or :data:`~tests.failover.baseline.QUIET_RATE`.
Load = Literal["busy", "quiet"]


@dataclass
class Fault:
    """One fault: from when it was injected to when the server was back (``healed``: the
    scenario says when, else the end of its block, ``ended``) and the pipeline had caught up
    again (``recovered``). ``detail`` says what was done to which server (e.g. ``SIGKILL node 2,
    leader of t/3``). Its delays must be back to their ``baseline`` (the window before it, at
    its ``load``) in a window starting within ``back_within`` seconds of the heal
    (:mod:`tests.failover.baseline`)."""

    name: str
    started: float
    ended: float = 0.0
    recovered: float = 0.0
    detail: str = ""
    healed: float = 0.0
    load: Load = "busy"
    back_within: float = 0.0
    baseline: Window | None = None
    #: The first window after the heal as fast as the baseline (None: none within the bound).
    back: Window | None = None
    #: When none was: the window that came closest.
    closest: Window | None = None
    #: What an operator saw meanwhile (a degraded mode's metric or health), as the scenario
    #: noted it.
    seen: str = ""


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
    #: Seconds from the heal to the first record on Kafka, and to the first effect, after it.
    published_again: float | None = None
    effects_again: float | None = None
    #: The baseline window and the first one as fast after the heal (None: not within the
    #: fault's bound, ``back_within`` seconds).
    load: str = "busy"
    baseline: Window | None = None
    back: Window | None = None
    closest: Window | None = None
    back_within: float = 0.0
    healed: float = 0.0
    seen: str = ""
    #: What the relay and inbox processes logged from just before the fault until it had
    #: recovered (:mod:`tests.failover.worker_logs`): printed when a check of it fails.
    logged: tuple[str, ...] = ()

    @property
    def back_after(self) -> float | None:
        """Seconds from the heal to the start of the first window as fast as the baseline."""
        return None if self.back is None else self.back.start - self.healed

    @property
    def back_ok(self) -> bool:
        return self.baseline is None or self.back is not None


def gaps(
    fault: Fault,
    committed_at: Mapping[UUID, float],
    arrivals: Mapping[UUID, Arrival],
    effect_at: Mapping[UUID, float],
    logged: tuple[str, ...] = (),
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
        published_again=_first_after(fault.healed, (a.at for a in arrivals.values())),
        effects_again=_first_after(fault.healed, effect_at.values()),
        load=fault.load,
        baseline=fault.baseline,
        back=fault.back,
        closest=fault.closest,
        back_within=fault.back_within,
        healed=fault.healed,
        seen=fault.seen,
        logged=logged,
    )


def _first_after(moment: float, times: Iterable[float]) -> float | None:
    """Seconds from ``moment`` to the first of ``times`` at or after it."""
    after = [t for t in times if t >= moment]
    return min(after) - moment if after and moment else None


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
        return (
            all(held for held, _ in self.guarantees.values())
            and not self.health
            and all(g.back_ok for g in self.faults)
        )

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
            "| fault | load | baseline | back to it after s (bound) | first window back "
            "| publishing again after s | effects again after s | what an operator saw |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        out += [
            f"| {g.name} | {g.load} | {g.baseline.describe() if g.baseline else '-'} "
            f"| {_seconds(g.back_after) if g.back else 'NOT BACK'} ({g.back_within:g}) "
            f"| {_first_window(g)} | {_seconds(g.published_again)} "
            f"| {_seconds(g.effects_again)} | {g.seen} |"
            for g in self.faults
            if g.baseline is not None
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
        """Every guarantee held, every process is healthy, every fault's delays were back to
        their baseline within its bound, and no fault's delivery or inbox gap exceeded
        ``max_gap`` seconds."""
        assert self.ok, self._explained([g for g in self.faults if not g.back_ok])
        slow = [g for g in self.faults if max(g.delivery, g.inbox) > max_gap]
        assert not slow, f"gaps over {max_gap} s:\n{self._explained(slow)}"

    def _explained(self, failed: list[Gaps]) -> str:
        """The table, then what the processes logged during each fault that failed a check."""
        out = self.lines()
        for g in failed:
            out.append(f"logged during {g.name} ({g.detail}):")
            out += [f"  {line}" for line in g.logged] or ["  nothing"]
        return "\n".join(out)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _first_window(g: Gaps) -> str:
    if g.back is not None:
        return g.back.describe()
    if g.closest is not None:
        return f"none; closest at +{g.closest.start - g.healed:.1f} s: {g.closest.describe()}"
    return "none"
