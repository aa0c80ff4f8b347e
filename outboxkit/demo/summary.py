"""What the demo measured, and how it shows it: a live table while it runs, a final report, and
a JSON document (``--json``). Pure: no I/O besides rendering."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

#: What running the relay without Kafka transactions gives up (docs/relay.md, residual risks).
UNFENCED_NOTE = (
    "Tansu has no Kafka transactions, so the relay ran with OUTBOXKIT_TRANSACTIONAL=false: "
    "nothing fences a zombie relay (G4). A relay frozen past its session timeout could publish "
    "again after another took over: the inbox absorbs those duplicates, but a key's order (G2) "
    "could break. No loss (G1) and effects once (G6) still hold. `--broker kafka` runs the "
    "transactional relay on Apache Kafka."
)


_DATABASES = {"postgresql": "PostgreSQL", "mongodb": "MongoDB"}
_BROKERS = {"tansu": "Tansu", "kafka": "Apache Kafka"}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) of ``values`` by the nearest-rank method; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class Latency:
    """Milliseconds: median, 99th percentile and maximum of ``count`` samples."""

    count: int = 0
    p50: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of_seconds(cls, samples: Sequence[float]) -> Latency:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 1)

        return cls(
            count=len(samples),
            p50=ms(percentile(samples, 0.5)),
            p99=ms(percentile(samples, 0.99)),
            max=ms(max(samples, default=None)),
        )

    def __str__(self) -> str:
        if not self.count:
            return "-"
        return f"p50 {_ms(self.p50)}  p99 {_ms(self.p99)}  max {_ms(self.max)}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


class KeyOrder:
    """Checks per-key order (G2) on a topic: the first appearances of a key's events must follow
    the order in which they were written. Re-sent events (seen before) are allowed anywhere."""

    def __init__(self) -> None:
        self._latest: dict[str, int] = {}
        self._seen: set[str] = set()
        self.violations: list[tuple[str, int, int]] = []

    def observe(self, key: str, seq: int, event_id: str) -> None:
        if event_id in self._seen:
            return
        self._seen.add(event_id)
        latest = self._latest.get(key)
        if latest is not None and seq < latest:
            self.violations.append((key, latest, seq))
        else:
            self._latest[key] = seq


@dataclass(slots=True)
class Progress:
    """A live snapshot."""

    phase: str = "starting"
    seconds: float = 0.0
    orders_target: int = 0
    orders_written: int = 0
    events_written: int = 0
    published: int = 0
    published_distinct: int = 0
    handled: int = 0
    duplicates_absorbed: int = 0
    dead_lettered: int = 0
    backlog: int | None = None
    relay: str = "-"
    latency: Latency = field(default_factory=Latency)


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The final result; ``lost`` must be 0."""

    #: postgresql or mongodb.
    database: str
    broker: str
    transactional: bool
    orders: int
    #: Events committed to an outbox: OrderPlaced (orders service) + PaymentCaptured (payments).
    events_written: int
    #: Records that reached the topics, re-sends included.
    events_published: int
    duplicates_published: int
    #: Events whose handler's effects committed (distinct, from the database).
    events_handled: int
    #: Deliveries the inboxes skipped because the event had taken effect before.
    duplicates_absorbed: int
    dead_lettered: int
    #: events_written - events_handled: written but never took effect.
    lost: int
    key_order_violations: int
    #: From an order's commit to its payment's commit (relay + payments inbox).
    latency_ms: Latency
    #: From an order's commit to the orders service marking it paid (two hops).
    round_trip_ms: Latency
    relay_kills: int
    #: From a SIGKILL to the new relay owning every partition.
    takeover_seconds: list[float]
    seconds: float
    #: Processes the demo started (servers, relays); none may outlive it.
    pids: list[int]
    workdir: str
    note: str | None

    @property
    def ok(self) -> bool:
        return self.lost == 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def live_table(p: Progress, title: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    resent = p.published - p.published_distinct
    rows: Iterable[tuple[str, str]] = [
        ("phase", f"{p.phase}  ({p.seconds:.1f} s)"),
        ("orders placed", f"{p.orders_written} / {p.orders_target}"),
        ("events written (outbox)", str(p.events_written)),
        ("outbox backlog", "-" if p.backlog is None else str(p.backlog)),
        ("published (on Kafka)", f"{p.published}" + (f"  ({resent} re-sent)" if resent else "")),
        ("handled (inboxes)", str(p.handled)),
        ("duplicates absorbed", str(p.duplicates_absorbed)),
        ("relay", p.relay),
        ("latency commit → handled", str(p.latency)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    if p.dead_lettered:
        table.add_row("dead-lettered", Text(str(p.dead_lettered), style="red"))
    return table


def final_report(s: DemoSummary) -> RenderableType:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "ran on", f"{_DATABASES.get(s.database, s.database)} + {_BROKERS.get(s.broker, s.broker)}"
    )
    table.add_row("orders placed", str(s.orders))
    table.add_row("events written", f"{s.events_written}  (OrderPlaced + PaymentCaptured)")
    table.add_row(
        "events published",
        f"{s.events_published}  ({s.duplicates_published} re-sent by the relay)",
    )
    table.add_row("events handled", f"{s.events_handled}  (effects committed once each)")
    table.add_row("duplicates absorbed", str(s.duplicates_absorbed))
    table.add_row("dead-lettered", str(s.dead_lettered))
    table.add_row("per-key order violations", str(s.key_order_violations))
    during = "  (the slowest waited for the takeover)" if s.relay_kills else ""
    table.add_row("latency commit → handled", f"{s.latency_ms}{during}")
    table.add_row("round trip order → paid", str(s.round_trip_ms))
    if s.relay_kills:
        takeovers = ", ".join(f"{t:.1f} s" for t in s.takeover_seconds) or "never"
        table.add_row("relay SIGKILLs", f"{s.relay_kills}  (new relay took over after {takeovers})")
    table.add_row(
        "lost", Text(str(s.lost), style="bold green" if s.lost == 0 else "bold red reverse")
    )
    verdict = (
        Text(
            f"Nothing lost: all {s.events_written} events took effect exactly once "
            f"({s.seconds:.0f} s).",
            style="green",
        )
        if s.ok
        else Text(f"{s.lost} events were written and never handled.", style="bold red")
    )
    parts: list[RenderableType] = [table, Text(), verdict]
    if s.note:
        parts += [Text(), Text(s.note, style="yellow")]
    return Group(*parts)
