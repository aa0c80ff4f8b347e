"""What the MongoDB relay's liveness check costs as mongod's connection count grows (#26).

Starts one mongod (a single-node replica set, as the tests do), announces two relays of one
group (the check only looks when there is another member), then times the check a relay runs
every second — ``announce_member`` then ``departed_members``, what the relay's departed task
does — at the server's few own connections and again with ``--connections`` more open (raw
sockets, each having sent a ``hello``, as idle clients of other services). Beside it, for
reference, the ``$currentOp`` aggregate over every connection that the check ran each second
before #26 (run this script against an older checkout to time that check itself)::

    python bench/presence.py                       # 10 and 3,000 connections
    python bench/presence.py --connections 900 --calls 200

Prints one line per connection count: median and 95th percentile of the check, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import time
from typing import Any

import bson
from pymongo import AsyncMongoClient

from outboxkit.embedded.mongodb import EmbeddedMongo
from outboxkit.migrations.mongodb import migrate
from outboxkit.relay import MongoOutboxStorage

GROUP = "outboxkit.relay.bench"
_OP_MSG = 2013


def _hello(request_id: int) -> bytes:
    body = bson.encode({"hello": 1, "$db": "admin", "client": {"application": {"name": "idle"}}})
    payload = struct.pack("<I", 0) + b"\x00" + body  # flag bits, then a kind-0 section
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, _OP_MSG) + payload


async def _open_idle(port: int, count: int) -> list[asyncio.StreamWriter]:
    """``count`` connections that said hello and now stay idle (kept open by the caller)."""

    async def one(i: int) -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_hello(i + 1))
        await writer.drain()
        (length,) = struct.unpack("<i", await reader.readexactly(4))
        await reader.readexactly(length - 4)
        return writer

    writers: list[asyncio.StreamWriter] = []
    for start in range(0, count, 200):
        writers += await asyncio.gather(*(one(i) for i in range(start, min(count, start + 200))))
    return writers


async def _time(calls: int, check: Any) -> tuple[float, float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await check()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


async def _connections(client: AsyncMongoClient[dict[str, Any]]) -> int:
    status = await client.admin.command({"serverStatus": 1, "repl": 0, "metrics": 0})
    return int(status["connections"]["current"])


async def run(args: argparse.Namespace) -> None:
    with EmbeddedMongo(fetch=True) as server:
        url = server.url("presence_bench")
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
        await migrate(client.get_database("presence_bench"))
        idle: list[asyncio.StreamWriter] = []
        try:
            async with (
                MongoOutboxStorage(url, app_name="relay-a") as a,
                MongoOutboxStorage(url, app_name="relay-b") as b,
            ):
                await b.announce_member(GROUP, "member-b")

                async def beat_b() -> None:  # B is alive and checks every second too
                    while True:
                        await b.announce_member(GROUP, "member-b")
                        await asyncio.sleep(1.0)

                async def check() -> None:
                    await a.announce_member(GROUP, "member-a")
                    assert await a.departed_members(GROUP, "member-a") == []

                async def current_op() -> None:
                    cursor = await client.admin.aggregate(
                        [
                            {"$currentOp": {"allUsers": True, "idleConnections": True}},
                            {"$match": {"appName": {"$in": ["x", "y"]}}},
                            {"$group": {"_id": "$appName"}},
                        ]
                    )
                    await cursor.to_list()

                beating = asyncio.create_task(beat_b())
                await asyncio.sleep(3.5)  # past the check's start-up grace (mongod's uptime)
                for extra in (0, args.connections):
                    idle += await _open_idle(server.port, extra - len(idle))
                    count = await _connections(client)
                    median, p95 = await _time(args.calls, check)
                    op_median, op_p95 = await _time(args.calls, current_op)
                    print(
                        f"connections {count:5d}: check median {median:6.2f} ms  p95 {p95:6.2f} ms"
                        f"   | $currentOp over all: median {op_median:6.2f} ms  p95 {op_p95:6.2f}"
                        " ms",
                        flush=True,
                    )
                beating.cancel()
        finally:
            for writer in idle:
                writer.close()
            await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--calls", type=int, default=100)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
