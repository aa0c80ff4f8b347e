"""Child processes: a group member or a transactional producer in a process of its own, so that
a probe can freeze (SIGSTOP) or kill (SIGKILL) it like a real one. The child is a second run
of ``bench/broker_features.py --child KIND …``; it talks JSON lines on stdout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.broker_probes.harness import (
    CHILD_READY_TIMEOUT,
    Ctx,
    ProbeFailed,
    describe,
    new_consumer,
    outcome,
    running,
)

#: The script a child runs: the same as the parent's, with ``--child``.
ENTRY = Path(__file__).resolve().parents[1] / "broker_features.py"


# --------------------------------------------------------------------------- child processes


@dataclass
class Child:
    proc: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def expect(self, event: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), CHILD_READY_TIMEOUT)
            if not line:
                raise ProbeFailed(f"child exited before {event!r}")
            message: dict[str, Any] = json.loads(line)
            if message.get("event") == "error":
                raise ProbeFailed(f"child: {message['error']}")
            if message.get("event") == event:
                return message

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.kill()
        await asyncio.wait_for(self.proc.wait(), 15)


async def spawn_child(ctx: Ctx, kind: str, *args: str) -> Child:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ENTRY),
        "--bootstrap",
        ctx.bootstrap,
        "--child",
        kind,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    return Child(proc)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def child_member(bootstrap: str, topic: str, group_id: str, session: str, hb: str) -> None:
    consumer = new_consumer(
        bootstrap, group_id=group_id, session_timeout_ms=int(session), heartbeat_interval_ms=int(hb)
    )
    consumer.subscribe([topic])
    await consumer.start()
    while True:
        await consumer.getmany(timeout_ms=200)
        if consumer.assignment():
            emit("assigned", partitions=sorted(tp.partition for tp in consumer.assignment()))


async def child_zombie(bootstrap: str, topic: str, txid: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txid, acks="all")
    async with running(producer):
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"a1-open")
        emit("sent")
        await asyncio.to_thread(sys.stdin.readline)
        send_err = await outcome(producer.send_and_wait(topic, b"a2-zombie"))
        commit_err = await outcome(producer.commit_transaction())
        abort_err = await outcome(producer.abort_transaction())
        results = {"send": send_err, "commit": commit_err, "abort": abort_err}
        emit("result", **{step: describe(err) for step, err in results.items()})


async def child_main(bootstrap: str, argv: Sequence[str]) -> None:
    try:
        if argv[0] == "member":
            await child_member(bootstrap, *argv[1:])
        else:
            await child_zombie(bootstrap, *argv[1:])
    except Exception as exc:
        emit("error", error=describe(exc))
