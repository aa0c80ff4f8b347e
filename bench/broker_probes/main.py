"""Measure what a Kafka-protocol broker supports, as seen by aiokafka (run it as
``bench/broker_features.py``): the probes' registry, running them, the Markdown table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.admin import AIOKafkaAdminClient

from bench.broker_probes.children import child_main
from bench.broker_probes.groups import (
    DEFAULTS,
    FAST,
    probe_group,
    probe_kip848,
    probe_no_poll,
    probe_paused,
)
from bench.broker_probes.harness import (
    FAIL,
    Ctx,
    describe,
    since,
)
from bench.broker_probes.partitioner import probe_partitioner
from bench.broker_probes.produce import probe_headers, probe_idempotent, probe_plain, probe_protocol
from bench.broker_probes.transactions import (
    probe_abandoned_txn,
    probe_fencing_between,
    probe_fencing_zombie,
    probe_transactions,
)

# --------------------------------------------------------------------------- runner


PROBES: dict[str, Callable[[Ctx], Awaitable[None]]] = {
    "protocol": probe_protocol,
    "plain": probe_plain,
    "headers": probe_headers,
    "idempotent": probe_idempotent,
    "transactions": probe_transactions,
    "fencing_between": probe_fencing_between,
    "fencing_zombie": probe_fencing_zombie,
    "abandoned_txn": probe_abandoned_txn,
    "partitioner": probe_partitioner,
    "group_fast": lambda ctx: probe_group(ctx, FAST),
    "group_defaults": lambda ctx: probe_group(ctx, DEFAULTS),
    "paused": probe_paused,
    "no_poll": probe_no_poll,
    "kip848": probe_kip848,
}


async def run_probe(ctx: Ctx, name: str, limit: float) -> None:
    print(f"probe {name} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(PROBES[name](ctx), limit)
    except TimeoutError:
        ctx.add(name, FAIL, since(t0), f"probe timed out after {limit:.0f}s")
    except Exception as exc:
        ctx.add(name, FAIL, since(t0), describe(exc))


async def cleanup(ctx: Ctx) -> None:
    if ctx.topics:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ctx.admin.delete_topics(ctx.topics), 15)


def render(ctx: Ctx) -> str:
    lines = [
        f"### {ctx.label} ({ctx.bootstrap})",
        "",
        "| probe | result | time | details |",
        "| --- | --- | --- | --- |",
    ]
    for row in ctx.rows:
        detail = row.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row.probe} | {row.status} | {row.seconds:.2f}s | {detail} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    admin_client = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap, request_timeout_ms=15000)
    await asyncio.wait_for(admin_client.start(), 20)
    ctx = Ctx(
        args.bootstrap, args.label or args.bootstrap, admin_client, kafka_jars=args.kafka_jars
    )
    names = args.only.split(",") if args.only else list(PROBES)
    try:
        for name in names:
            await run_probe(ctx, name, args.probe_timeout)
    finally:
        await cleanup(ctx)
        await admin_client.close()
    print(render(ctx))
    return 0 if all(row.status != FAIL for row in ctx.rows) else 1


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure what a Kafka-protocol broker supports, as seen by aiokafka."
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:29092")
    parser.add_argument("--label", default="")
    parser.add_argument("--only", default="", help="comma-separated probe names")
    parser.add_argument("--list", action="store_true", help="print probe names and exit")
    parser.add_argument("--probe-timeout", type=float, default=150.0)
    parser.add_argument(
        "--kafka-jars",
        default=None,
        help="folder with kafka-clients and slf4j jars: also compare with the Java partitioner",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        print("\n".join(PROBES))
        return 0
    if args.child:
        asyncio.run(child_main(args.bootstrap, args.child))
        return 0
    return asyncio.run(main_async(args))
