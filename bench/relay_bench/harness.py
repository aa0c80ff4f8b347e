"""What every phase of the relay benchmark shares: the context, results, CPU accounting, Kafka
helpers, and reading the relays' Prometheus metrics (counters, latency, per-stage breakdown)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from prometheus_client.parser import text_string_to_metric_families

from bench.relay_bench.order import Published, order_violations
from outboxkit.relay.metrics import STAGES
from outboxkit.schemas import EncodedEvent, Event

if TYPE_CHECKING:
    from bench.relay_bench.outbox import BenchOutbox
    from bench.relay_bench.security import KafkaSecurity
    from outboxkit.embedded import EmbeddedMongo, EmbeddedPostgres, KafkaCluster

SOURCE = "urn:service:bench"
CEILING_TOPIC = "bench.ceiling"
DRAIN_TOPIC = "bench.drain"
LATENCY_TOPIC = "bench.latency"
CHURN_TOPIC = "bench.churn"


def say(text: str = "") -> None:
    print(text, flush=True)


# -- the event ---------------------------------------------------------------------------------


class OrderPlaced(
    Event, type="bench.order_placed", version=1, topic=DRAIN_TOPIC, key_field="customer_id"
):
    order_id: str
    customer_id: str
    amount: Decimal
    currency: str
    lines: int
    note: str
    #: The event's number among its key's events, in the key's commit order (bench/relay_bench/
    #: order.py checks it on the topic). The last field: :func:`with_seq` rewrites it.
    seq: int = 0


def customer_id(key: int) -> str:
    """The event key of key number ``key`` (of ``--keys``)."""
    return f"customer-{key:05d}"


def make_event(
    rng: random.Random, keys: int, topic: str, *, key: int | None = None, seq: int = 0
) -> OrderPlaced:
    """An event of key number ``key`` (a random one of ``keys`` if None), numbered ``seq``."""
    n = rng.randrange(1_000_000_000)
    return OrderPlaced(
        topic=topic,
        order_id=f"order-{n:09d}",
        customer_id=customer_id(rng.randrange(keys) if key is None else key),
        amount=Decimal(n % 100_000) / 100,
        currency="EUR",
        lines=1 + n % 7,
        note="gift wrap, leave at the door if nobody answers",
        seq=seq,
    )


#: How an event written with the default ``seq`` ends on the wire (its value, compact JSON).
SEQ_PLACEHOLDER = b'"seq":0}'


def with_seq(value: bytes, seq: int) -> bytes:
    """An encoded :class:`OrderPlaced` written with ``seq=0``, as if written with ``seq``."""
    if not value.endswith(SEQ_PLACEHOLDER):
        raise ValueError(f"not a bench event written with seq=0: {value[-40:]!r}")
    return value[: -len(SEQ_PLACEHOLDER)] + b'"seq":%d}' % seq


def record_size(wire: EncodedEvent) -> int:
    return (
        len(wire.key)
        + len(wire.value)
        + sum(len(name) + len(value) for name, value in wire.headers)
    )


# -- results -----------------------------------------------------------------------------------


@dataclass
class Result:
    phase: str
    case: str
    figure: str
    ratio: str = ""
    note: str = ""
    #: Per-key order violations in what the case published (read back), if it checks them.
    order: str = ""


def print_table(rows: Sequence[Result]) -> None:
    headers = ("phase", "case", "figure", "order violations", "ratio", "note")
    cells = [(r.phase, r.case, r.figure, r.order, r.ratio, r.note) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    say("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    say("  ".join("-" * w for w in widths))
    for c in cells:
        say("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def pct(values: Sequence[float], quantile: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def latency_figures(values: Sequence[float]) -> str:
    return (
        f"p50 {ms(pct(values, 0.5))}, p99 {ms(pct(values, 0.99))}, max {ms(max(values))}"
        if values
        else "no data"
    )


# -- CPU accounting (where do the two cores go?) -----------------------------------------------


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """pid → (parent pid, CPU seconds used so far, of which in user mode)."""
    ticks = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rindex(")") + 2 :].split()
        user, system = int(rest[11]) / ticks, int(rest[12]) / ticks
        table[int(entry.name)] = (int(rest[1]), user + system, user)
    return table


def _machine_busy() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / ticks


@dataclass
class CpuSnapshot:
    at: float
    groups: dict[str, float]
    machine: float
    #: Of ``groups``, the CPU seconds in user mode (the rest is the kernel's: system calls).
    user: dict[str, float] = field(default_factory=dict)

    def seconds(self, later: CpuSnapshot, group: str) -> float:
        return later.groups.get(group, 0.0) - self.groups.get(group, 0.0)

    def user_seconds(self, later: CpuSnapshot, group: str) -> float:
        return later.user.get(group, 0.0) - self.user.get(group, 0.0)


class CpuMeter:
    """CPU seconds of process trees (PostgreSQL, Kafka, relays) and of the whole machine."""

    def __init__(self) -> None:
        self.roots: dict[str, list[int]] = {}

    def snapshot(self, extra: dict[str, list[int]] | None = None) -> CpuSnapshot:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        all_groups = {**self.roots, **(extra or {})}
        group_roots = {pid for roots in all_groups.values() for pid in roots}
        groups: dict[str, float] = {}
        user: dict[str, float] = {}
        for name, roots in all_groups.items():
            # A tree stops where another group's tree starts (relays started by this process).
            total, in_user, todo = 0.0, 0.0, list(roots)
            while todo:
                pid = todo.pop()
                if pid in table:
                    total += table[pid][1]
                    in_user += table[pid][2]
                    todo.extend(c for c in children.get(pid, []) if c not in group_roots)
            groups[name], user[name] = total, in_user
        return CpuSnapshot(time.monotonic(), groups, _machine_busy(), user)

    @staticmethod
    def describe(before: CpuSnapshot, after: CpuSnapshot) -> str:
        wall = max(after.at - before.at, 1e-9)
        parts = [
            f"{name} {(after.groups[name] - before.groups.get(name, 0.0)) / wall:.2f}"
            for name in after.groups
        ]
        known = sum(after.groups[n] - before.groups.get(n, 0.0) for n in after.groups)
        other = (after.machine - before.machine - known) / wall
        parts.append(f"other {max(other, 0.0):.2f}")
        return "CPU cores busy: " + ", ".join(parts) + f" (of {os.cpu_count()})"


def relay_cpu_ms(before: CpuSnapshot, after: CpuSnapshot, events: float) -> float:
    """Relay-process CPU milliseconds per event."""
    return before.seconds(after, "relays") * 1000 / max(events, 1)


def relay_cpu_per_event(before: CpuSnapshot, after: CpuSnapshot, events: float) -> str:
    """Relay-process CPU per event: the figure the relay's own efficiency is judged by."""
    seconds = before.seconds(after, "relays")
    user = before.user_seconds(after, "relays")
    per = 1000 / max(events, 1)
    return (
        f"relay CPU {seconds * per:.3f} ms/event ({user * per:.3f} user, "
        f"{(seconds - user) * per:.3f} system)"
    )


# -- context -----------------------------------------------------------------------------------

#: Order violations listed per case at the end of a run (all are counted).
ORDER_SHOWN = 10


@dataclass
class Ctx:
    args: argparse.Namespace
    outbox: BenchOutbox
    bootstrap: str
    admin: AIOKafkaAdminClient
    workdir: Path
    cpu: CpuMeter
    #: How the relays reach Kafka (``--kafka-security``); ``bootstrap`` is the bench's own.
    security: KafkaSecurity
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    results: list[Result] = field(default_factory=list)
    ceiling_plain: float | None = None
    ceiling_txn: float | None = None
    keep_workdir: bool = False
    #: Which database ``outbox`` is (``postgresql``, ``mongodb``).
    database: str = "postgresql"
    #: Several databases in one run: each result's phase names its database.
    labelled: bool = False
    #: Several ``--kafka-security`` values in one run: each result's phase names its protocol.
    security_labelled: bool = False
    #: Relay count → drain rate (events/s; the median of the runs), for the comparison.
    drain_rates: dict[int, float] = field(default_factory=dict)
    #: One line per per-key order violation found (shared by every database's context): the
    #: run prints them after the summary and exits non-zero.
    order_failures: list[str] = field(default_factory=list)
    #: Figures compared across ``--kafka-security`` values (``main.compare_security``): drain
    #: events/s and relay CPU ms/event per relay count, steady p50/p99 seconds and CPU…
    figures: dict[str, float] = field(default_factory=dict)
    #: The servers this run started (None when given by URL): the churn phase's ``faults`` case
    #: kills and restarts them.
    kafka_cluster: KafkaCluster | None = None
    database_server: EmbeddedPostgres | EmbeddedMongo | None = None

    @property
    def where(self) -> str:
        """Which database and protocol this context measures, as far as the run has several."""
        parts = [self.database] if self.labelled else []
        return ", ".join(parts + ([self.security.label] if self.security_labelled else []))

    def add(self, result: Result) -> None:
        parts = [self.database] if self.labelled and result.phase != "ceiling" else []
        parts += [self.security.label] if self.security_labelled else []
        if parts:
            result.phase = f"{result.phase} ({', '.join(parts)})"
        self.results.append(result)

    def check_order(self, case: str, records: Iterable[Published]) -> int:
        """Per-key order (G2) of what ``case`` (its phase first) read back; each violation is
        kept for the end of the run. Returns how many records broke it."""
        violations = order_violations(records)
        labels = [self.database] + ([self.security.label] if self.security_labelled else [])
        where = f"{case} ({', '.join(labels)})"
        for violation in violations[:ORDER_SHOWN]:
            self.order_failures.append(f"{where}: {violation}")
        if len(violations) > ORDER_SHOWN:
            self.order_failures.append(f"{where}: … {len(violations) - ORDER_SHOWN} more")
        if violations:
            self.keep_workdir = True
            say(f"  ORDER VIOLATED, {len(violations)} record(s); the first: {violations[0]}")
        return len(violations)


def transactional_producer(ctx: Ctx, name: str, **config: Any) -> AIOKafkaProducer:
    """A transactional producer set up as the relay's (acks=all, idempotent, no linger, 10 s
    transaction and request timeouts), named ``bench-<name>`` (unique per run), on the listener
    the relays use (``ctx.security``); ``config`` adds or overrides aiokafka settings."""
    settings: dict[str, Any] = {
        **ctx.security.client_options(),
        "acks": "all",
        "enable_idempotence": True,
        "transactional_id": f"bench-{name}-{ctx.run_id}",
        "transaction_timeout_ms": 10_000,
        "request_timeout_ms": 10_000,
        "linger_ms": 0,
        "client_id": f"bench-{name}",
    }
    return AIOKafkaProducer(**{**settings, **config})


async def ensure_topic(ctx: Ctx, topic: str, partitions: int) -> None:
    with contextlib.suppress(TopicAlreadyExistsError):
        await ctx.admin.create_topics([NewTopic(topic, partitions, 1)])
    for _ in range(100):
        meta = await ctx.admin.describe_topics([topic])
        if meta and len(meta[0].get("partitions", [])) == partitions:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} has not {partitions} partitions")


async def group_state(ctx: Ctx, group_id: str) -> tuple[int, str]:
    try:
        responses = await ctx.admin.describe_consumer_groups([group_id])
    except Exception:
        return 0, "unknown"
    for response in responses:
        for group in response.groups:
            # (error_code, group_id, state, protocol_type, protocol, members, …)
            return len(group[5]), str(group[2])
    return 0, "unknown"


# -- the relays' metrics -----------------------------------------------------------------------


def metric_sum(texts: Iterable[str], sample_name: str, **labels: str) -> float:
    total = 0.0
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == sample_name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
    return total


def histogram_buckets(texts: Iterable[str], name: str, **labels: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram ``name`` summed over processes and labels."""
    buckets: dict[float, float] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{name}_bucket" and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def bucket_quantile(before: dict[float, float], after: dict[float, float], q_: float) -> str:
    diff = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = diff.get(math.inf, 0.0)
    if total <= 0:
        return "n/a"
    for le, count in diff.items():
        if count >= q_ * total:
            return "> max" if math.isinf(le) else f"≤ {le * 1000:g} ms"
    return "n/a"


STAGE_METRIC = "outboxkit_relay_stage_seconds"


def stage_breakdown(before: Sequence[str], after: Sequence[str]) -> str:
    """Mean time per occurrence of each stage of the relays' cycles, between two scrapes, and
    how many cycles ran (``claim`` happens once per cycle)."""
    parts = []
    cycles = metric_sum(after, f"{STAGE_METRIC}_count", stage="claim") - metric_sum(
        before, f"{STAGE_METRIC}_count", stage="claim"
    )
    for stage in STAGES:
        count = metric_sum(after, f"{STAGE_METRIC}_count", stage=stage) - metric_sum(
            before, f"{STAGE_METRIC}_count", stage=stage
        )
        total = metric_sum(after, f"{STAGE_METRIC}_sum", stage=stage) - metric_sum(
            before, f"{STAGE_METRIC}_sum", stage=stage
        )
        if count > 0:
            parts.append(f"{stage} {total / count * 1000:.2f} ms x{count:.0f}")
    return f"{cycles:.0f} cycles; mean per stage: " + ", ".join(parts)
