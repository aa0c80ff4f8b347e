"""Probe of the default partitioner: murmur2 as the Java client computes it."""

from __future__ import annotations

import asyncio
import random
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from aiokafka.partitioner import murmur2

from bench.broker_probes.harness import (
    FAIL,
    OK,
    Ctx,
    create_topic,
    new_producer,
    running,
    since,
)

# --------------------------------------------------------------------------- partitioner


def java_partitions(jars: str, keys: Sequence[bytes], n: int) -> list[int]:
    source = (
        "import org.apache.kafka.common.utils.Utils;\n"
        "public class Murmur { public static void main(String[] a) {\n"
        " int n = Integer.parseInt(a[0]);\n"
        " for (int i = 1; i < a.length; i++) {\n"
        "  byte[] k = java.util.HexFormat.of().parseHex(a[i]);\n"
        "  System.out.println(Utils.toPositive(Utils.murmur2(k)) % n); } } }\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Murmur.java"
        path.write_text(source)
        argv = ["java", "-cp", f"{jars}/*", str(path), str(n), *(k.hex() for k in keys)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return [int(line) for line in out.stdout.split()]


async def probe_partitioner(ctx: Ctx) -> None:
    n = 6
    topic = await create_topic(ctx, "part", partitions=n)
    rng = random.Random(848)
    keys = [rng.randbytes(rng.randint(1, 24)) for _ in range(17)] + [b"order-1", b"a", b""]
    expected = [(murmur2(k) & 0x7FFFFFFF) % n for k in keys]
    t0 = time.monotonic()
    async with running(new_producer(ctx)) as producer:
        chosen = [(await producer.send_and_wait(topic, b"v", key=k)).partition for k in keys]
    same = chosen == expected
    detail = f"20 keys, {n} partitions: default partitioner == toPositive(murmur2(key)) % n: {same}"
    if ctx.kafka_jars:
        java = await asyncio.to_thread(java_partitions, ctx.kafka_jars, keys, n)
        detail += f"; == Java client Utils.toPositive(Utils.murmur2(key)) % n: {java == chosen}"
        same = same and java == chosen
    ctx.add("partitioner_murmur2", OK if same else FAIL, since(t0), detail)
