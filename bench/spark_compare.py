"""The compare phase of bench/spark.py (issue #31): the pipeline against the job a data engineer
writes by hand instead, in the same SparkSession, alternating, with Spark's CPU per event.

The hand-written job: ``readStream.format("kafka")`` → ``from_json(value::string, <OrderPlaced
payload schema>)`` → ``foreachBatch(df.write.jdbc(..., mode="append"))`` with Spark's default
JDBC options: no validation, no dedupe, no quarantine. The pipeline: the demo's job
(``order_totals``) into PostgreSQL only. Both available-now, the same records per micro-batch,
a fresh checkpoint and table each run. The diagnostic variants (:data:`JOB_VARIANTS`) each leave
one part of the pipeline out, to say what it costs; they are not valid pipelines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import statistics
import tempfile
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.spark_same_work import SAME_WORK_VARIANTS, same_work, validated
from outboxkit.core.maven import copy_dependencies
from outboxkit.demo.events import OrderPlaced


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants, from ``/proc``: the
    Spark JVM and its Python workers (Kafka and PostgreSQL are not counted)."""
    return sum(_processes(pid).values())


def _processes(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and of each live descendant."""
    found: dict[int, float] = {}
    pending = [pid]
    ticks = os.sysconf("SC_CLK_TCK")
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            found[current] = (int(fields[11]) + int(fields[12])) / ticks
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
    return found


class CpuMeter:
    """Spark's CPU during a run: the JVM's and its Python workers', sampled every 0.2 s so that
    a worker that ends during the run still counts (Spark ends a Python worker idle for a
    minute, unreaped into any parent's times: summing the live processes at the start and at
    the end made its CPU vanish during whichever job ran then, a job without Python then
    measuring below its true cost, even below zero)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._first = _processes(pid)
        self._last = dict(self._first)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.2):
            self._last.update(_processes(self.pid))

    def stop(self) -> tuple[float, float]:
        """CPU seconds of the JVM and of its Python workers since the start."""
        self._done.set()
        self._thread.join()
        self._last.update(_processes(self.pid))
        used = {p: cpu - self._first.get(p, 0.0) for p, cpu in self._last.items()}
        return used.pop(self.pid, 0.0), sum(used.values())


def breakdown(report: Any) -> str:
    """Where the micro-batches' time went: Spark's durationMs and the sinks, per batch."""
    n = max(report.batches, 1)
    spark = ", ".join(
        f"{k} {v / n / 1000:.2f}"
        for k, v in sorted(report.duration_ms.items(), key=lambda kv: -kv[1])
        if v / n >= 5  # ms: leave out what never costs anything
    )
    steps = ", ".join(f"{k} {v / n:.2f}" for k, v in report.step_seconds.items())
    return f"    s per batch: {spark}\n    addBatch steps: {steps}"


#: The hand-written job's PostgreSQL JDBC driver (group, artifact, version), fetched with Maven.
JDBC_DRIVER = ("org.postgresql", "postgresql", "42.7.14")

#: OrderPlaced's payload as a data engineer writes it for ``from_json`` (its JSON fields).
ORDER_SCHEMA = (
    "order_id STRING, customer_id STRING, currency STRING, "
    "lines ARRAY<STRUCT<sku: STRING, quantity: INT, unit_price: DECIMAL(38,2)>>, "
    "amount DECIMAL(38,2), note STRING"
)

#: What ``--jobs`` may name besides ``hand-written`` and ``pipeline``: a kind, then modifiers.
#: Diagnostics only (each weakens a guarantee): they say what a part of the pipeline costs.
JOB_VARIANTS = {
    "pipeline:no-quarantine": "no quarantine sink (the batch's rows are read once, by totals)",
    "pipeline:no-dedupe": "no watermark nor dropDuplicatesWithinWatermark (no state store)",
    "pipeline:no-persist": "the micro-batch is not persisted (each sink reads it again)",
    "pipeline:noop-sink": "totals computed, then written to Spark's noop format",
    "pipeline:dedupe-shuffle-only": "the dedupe's shuffle on its key, without the watermark "
    "nor the state store (what the state costs beyond the shuffle)",
    "pipeline:no-python-pass": "the decoder's Python pass replaced by a null (every row still "
    "decoded, deduplicated, cached and totalled: what the pass costs in the pipeline)",
    "hand-written:pipeline-decode": "the hand-written job with the pipeline's decoder",
    "hand-written:same-work-decode": "the hand-written job with the same-work job's decode and "
    "validation (its valid rows)",
    **SAME_WORK_VARIANTS,
    "hand-written:scalars": "the hand-written job without the order lines (not parsed then)",
    "hand-written:headers": "the hand-written job reading the headers too (their count)",
    "hand-written:pipeline-decode:no-python-pass": "… without the decoder's Python pass",
    "hand-written:pipeline-decode:no-canonical": "… without the decoder's canonical check",
    "hand-written:pipeline-decode:no-checks": "… without the decoder's payload checks",
    "<job>:<key>=<value>": "a Spark SQL setting for this job's query only",
}


def jdbc_driver() -> list[Path]:
    """The PostgreSQL JDBC driver's jars, fetched with Maven once into outboxkit's cache."""
    group, artifact, version = JDBC_DRIVER
    dest = Path.home() / ".cache" / "outboxkit" / f"{artifact}-jdbc-{version}"
    if not (dest / f"{artifact}-{version}.jar").exists():
        with tempfile.TemporaryDirectory(prefix="outboxkit-jdbc-") as work:
            jars = Path(work) / "jars"
            result = copy_dependencies([JDBC_DRIVER], jars, work=Path(work), name=artifact)
            if result.returncode:
                output = (result.stdout + result.stderr)[-2000:]
                raise SystemExit(f"Maven could not fetch {group}:{artifact}:{version}:\n{output}")
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(jars, dest)
    return sorted(dest.glob("*.jar"))


def _jdbc(url: str) -> tuple[str, dict[str, str]]:
    """A libpq URL as Spark's JDBC URL and connection properties."""
    parts = urllib.parse.urlsplit(url)
    props = {"driver": "org.postgresql.Driver", "user": parts.username or "postgres"}
    if parts.password:
        props["password"] = urllib.parse.unquote(parts.password)
    return f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}", props


@dataclasses.dataclass(frozen=True)
class Compare:
    """What every job of the compare phase shares: the session, the topic, the database."""

    spark: Any
    jvm: int
    bootstrap: str
    topic: str
    pg_url: str
    workdir: Path
    batch: int
    settings: Callable[[str], Any]


@dataclasses.dataclass(frozen=True)
class _Run:
    job: str
    rows: int
    seconds: float
    cpu: float
    report: Any
    python_cpu: float = 0.0
    """Of ``cpu``, the Python workers' (the JVM's descendants)."""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def us(self) -> float:
        return self.cpu / max(self.rows, 1) * 1e6


_DECODERS = {"pipeline-decode", "same-work-decode", "headers"}


def _hand_written(ctx: Compare, name: str, modifiers: list[str]) -> Any:
    """readStream kafka → from_json → foreachBatch JDBC append (Spark's default options)."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    from outboxkit.pipeline.job import report  # noqa: PLC0415

    url, props = _jdbc(ctx.pg_url)
    records = (
        ctx.spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", ctx.bootstrap)
        .option("subscribe", ctx.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", ctx.batch)
        .option("includeHeaders", str(bool(_DECODERS & {*modifiers})).lower())
        .load()
    )
    if "same-work-decode" in modifiers:
        orders = validated(records).where("reason IS NULL").select("o")
    elif "pipeline-decode" in modifiers:
        from outboxkit.demo.events import registry  # noqa: PLC0415
        from outboxkit.pipeline import decode, event_column, valid_events  # noqa: PLC0415

        order = F.col(event_column(OrderPlaced)).alias("o")
        with _decoder_parts_off(modifiers):
            orders = valid_events(decode(records, registry)).select(order)
    else:
        value = F.col("value").cast("string")
        extra = [F.size("headers").alias("headers")] if "headers" in modifiers else []
        orders = records.select(F.from_json(value, ORDER_SCHEMA).alias("o"), *extra)
    scalars = ["o.order_id", "o.customer_id", "o.currency", "o.amount", "o.note"]
    if "scalars" in modifiers:  # Spark then parses only these fields of the JSON
        orders = orders.select(*scalars)
    else:  # every field of the payload; JDBC has no type for an array of structs: JSON text
        lines = F.to_json("o.lines").alias("lines")
        orders = orders.select(*scalars, lines, *(["headers"] if "headers" in modifiers else []))

    def append(batch: Any, _batch_id: int) -> None:
        batch.write.jdbc(url, name, mode="append", properties=props)

    query = (
        orders.writeStream.queryName(name)
        .foreachBatch(append)
        .option("checkpointLocation", str(ctx.workdir / "checkpoints" / name))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception():
        raise SystemExit(f"{name} failed: {query.exception()}")
    return report(query)


@contextlib.contextmanager
def _decoder_parts_off(modifiers: list[str]) -> Iterator[None]:
    """While the decoder's plan is built: without its Python pass (``no-python-pass``), its
    canonical check (``no-canonical``) or its payload checks (``no-checks``). Diagnostics:
    the decoder is then neither exact nor safe."""
    from unittest import mock  # noqa: PLC0415

    from pyspark.sql import functions as F  # noqa: PLC0415

    from outboxkit.pipeline import decoder  # noqa: PLC0415

    def null_pass(_function: Any, schema: Any) -> Callable[..., Any]:
        return lambda *_columns: F.lit(None).cast(schema)

    def value_text(*_args: Any, **_kwargs: Any) -> Any:
        return F.col("value").cast("string")

    with contextlib.ExitStack() as patches:
        if "no-python-pass" in modifiers:
            patches.enter_context(mock.patch.object(decoder, "arrow_udf", null_pass))
        if "no-canonical" in modifiers:
            patches.enter_context(mock.patch.object(F, "to_json", value_text))
        if "no-checks" in modifiers:
            patches.enter_context(
                mock.patch.object(decoder, "payload_checks", return_value=F.lit(True))
            )
        yield


class _NoopSink:
    """Computes the rows and writes them nowhere (Spark's ``noop`` format)."""

    name = "noop"

    def prepare(self, spark: Any, output: str, database_url: str | None) -> None:
        pass

    def write(self, rows: Any, batch: Any) -> bool:
        rows.write.format("noop").mode("overwrite").save()
        return True


def _shuffled_on_the_dedupe_key(decoded: Any, _settings: Any) -> Any:
    """The dedupe's exchange alone: the rows hash-partitioned on the dedupe key into the
    shuffle partitions, as ``dropDuplicatesWithinWatermark`` partitions them, no state."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    key = F.coalesce(
        F.col("event_id"), F.concat_ws(":", F.lit("kafka"), "topic", "partition", "offset")
    )
    return decoded.repartition(key)


def _pipeline(ctx: Compare, name: str, modifiers: list[str]) -> Any:
    """The demo's job into PostgreSQL only, as the other phases run it, with ``modifiers``."""
    from unittest import mock  # noqa: PLC0415

    from pyspark.sql import DataFrame  # noqa: PLC0415

    from outboxkit.demo.pipeline import order_totals  # noqa: PLC0415
    from outboxkit.pipeline import PostgresSink, run  # noqa: PLC0415
    from outboxkit.pipeline import job as job_module  # noqa: PLC0415

    settings = ctx.settings(name)
    job = order_totals(settings, table=name)
    output = job.outputs[0]
    sinks: list[Any] = [s for s in output.sinks if isinstance(s, PostgresSink)]
    if "noop-sink" in modifiers:
        sinks = [_NoopSink()]
    job = dataclasses.replace(
        job,
        outputs=[dataclasses.replace(output, sinks=sinks)],
        quarantine=None if "no-quarantine" in modifiers else job.quarantine,
    )
    with contextlib.ExitStack() as patches:
        if "no-dedupe" in modifiers:
            patches.enter_context(
                mock.patch.object(job_module, "deduplicated", lambda decoded, _settings: decoded)
            )
        if "dedupe-shuffle-only" in modifiers:
            patches.enter_context(
                mock.patch.object(job_module, "deduplicated", _shuffled_on_the_dedupe_key)
            )
        # The decoder's parts, left out while the query's plan is built (start() decodes).
        patches.enter_context(_decoder_parts_off(modifiers))
        if "no-persist" in modifiers:
            for method in ("persist", "unpersist"):
                patches.enter_context(
                    mock.patch.object(DataFrame, method, lambda self, *_args, **_kw: self)
                )
        return run(job, settings, spark=ctx.spark)


def _run_job(ctx: Compare, job: str, round_: int) -> _Run:
    kind, *modifiers = job.split(":")
    name = "_".join([kind, *(m for m in modifiers if "=" not in m), str(round_)])
    confs = dict(m.split("=", 1) for m in modifiers if "=" in m)
    if confs:  # a table and a checkpoint of its own
        name += f"_{zlib.crc32(job.encode()):08x}"
    name = name.replace("-", "_")
    before = {key: ctx.spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        ctx.spark.conf.set(key, value)
    meter = CpuMeter(ctx.jvm)
    started = time.perf_counter()
    try:
        if kind == "same-work":
            report = same_work(ctx, name, modifiers, _jdbc(ctx.pg_url))
        else:
            job = _hand_written if kind == "hand-written" else _pipeline
            report = job(ctx, name, modifiers)
    finally:
        for key, value in before.items():
            if value is None:
                ctx.spark.conf.unset(key)
            else:
                ctx.spark.conf.set(key, value)
    seconds = time.perf_counter() - started
    own, python = meter.stop()
    return _Run(job, report.input_rows, seconds, own + python, report, python)


def compare_phase(ctx: Compare, jobs: list[str], rounds: int) -> None:
    """Every job once per round, in an order rotated each round; then medians and ratios."""
    print(f"compare, {rounds} rounds of {', '.join(jobs)}:")
    runs: dict[str, list[_Run]] = {job: [] for job in jobs}
    for round_ in range(1, rounds + 1):
        shift = (round_ - 1) % len(jobs)
        for job in jobs[shift:] + jobs[:shift]:
            r = _run_job(ctx, job, round_)
            runs[job].append(r)
            print(
                f"  round {round_} {job}: {r.rows:,} events in {r.seconds:.1f} s "
                f"({r.report.batches} batches) = {r.rate:,.0f} events/s; "
                f"Spark's CPU {r.us:.1f} us/event "
                f"(Python workers {r.python_cpu / max(r.rows, 1) * 1e6:.1f})"
            )
            print(breakdown(r.report))
    warm = slice(1, None) if rounds > 1 else slice(None)
    first = "2" if rounds > 1 else "1"
    print(
        f"compare, medians of rounds {first}-{rounds} (round 1 in brackets), "
        f"order rotated each round, load average {os.getloadavg()[0]:.1f} at the end:"
    )
    bases = [b for b in ("hand-written", "same-work") if b in runs]
    header = f"  {'job':<44} {'events/s':>18} {'us/event':>13}"
    print(header + "".join(f"  {'x ' + b + ' (ev/s, CPU)':>30}" for b in bases))
    for job, done in runs.items():
        rate = statistics.median(r.rate for r in done[warm])
        us = statistics.median(r.us for r in done[warm])
        line = f"  {job:<44} {rate:>8,.0f} ({done[0].rate:>7,.0f}) {us:>5.1f} ({done[0].us:>5.1f})"
        for b in bases:
            line += "  " + (f"{'':>30}" if job == b else f"{_ratios(done, runs[b], warm):>30}")
        print(line)
    if "pipeline" in runs and "same-work" in runs:
        print(
            "  outboxkit ÷ same-work, same round (median, range): "
            + _ratios(runs["pipeline"], runs["same-work"], warm, ranges=True)
        )
        print("  targets (#42): outboxkit >= 0.9x the same-work job's events/s, <= 1.2x its CPU")


def _ratios(done: list[_Run], base: list[_Run], warm: slice, *, ranges: bool = False) -> str:
    """Median ratios of events/s and CPU per event to ``base``'s run of the same round."""
    rates = [r.rate / b.rate for r, b in zip(done[warm], base[warm], strict=True)]
    cpus = [r.us / b.us for r, b in zip(done[warm], base[warm], strict=True)]
    if not ranges:
        return f"{statistics.median(rates):.2f}x, {statistics.median(cpus):.2f}x"
    return (
        f"events/s {statistics.median(rates):.2f}x ({min(rates):.2f}-{max(rates):.2f}), "
        f"CPU per event {statistics.median(cpus):.2f}x ({min(cpus):.2f}-{max(cpus):.2f})"
    )
