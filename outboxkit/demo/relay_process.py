"""The relay as the demo runs it: ``python -m outboxkit relay`` in a process of its own, so that
``--kill-relay`` can SIGKILL it, and its /healthz read to see which partitions it owns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

from outboxkit.embedded import die_with_parent, free_port

#: Fast failover: a killed relay's partitions move after ~3 s on Kafka. Tansu makes a lone
#: member that rejoins wait about twice the session timeout.
RELAY_ENV = {
    "OUTBOXKIT_RELAY_NAME": "demo",
    "OUTBOXKIT_SESSION_TIMEOUT": "3",
    "OUTBOXKIT_HEARTBEAT_INTERVAL": "0.5",
    "OUTBOXKIT_SWEEP_INTERVAL": "1",
    "OUTBOXKIT_REVOKE_TIMEOUT": "5",
    "OUTBOXKIT_TRANSACTION_TIMEOUT": "5",
    "OUTBOXKIT_RETRY_BACKOFF_MAX": "0.5",
    "OUTBOXKIT_METRICS_INTERVAL": "1",
}


class RelayProcess:
    """``python -m outboxkit relay`` with the demo's settings; /healthz on a free port."""

    def __init__(self, number: int, env: dict[str, str], workdir: Path) -> None:
        self.number = number
        self.http_port = free_port()
        self.log_path = workdir / f"relay-{number}.log"
        self.env = {**env, "OUTBOXKIT_HTTP_PORT": str(self.http_port)}
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False

    def start(self) -> RelayProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "outboxkit", "relay"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, before exec
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.alive():
            self.process.kill()
            self.process.wait(10)
        self.killed = True

    async def stop(self, grace: float = 15.0) -> None:
        """SIGTERM: the relay drains and leaves the group; SIGKILL if it takes too long."""
        if self.process is None or not self.alive():
            return
        self.process.terminate()
        try:
            await asyncio.to_thread(self.process.wait, grace)
        except subprocess.TimeoutExpired:
            self.kill()

    async def owned_partitions(self) -> int | None:
        """How many partitions the relay owns, from its /healthz; None if it does not answer."""
        if not self.alive():
            return None
        try:
            async with asyncio.timeout(1):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.http_port)
                try:
                    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
                    await writer.drain()
                    response = await reader.read()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError):
            return None
        try:
            return len(json.loads(response.partition(b"\r\n\r\n")[2])["owned"])
        except (ValueError, KeyError, TypeError):
            return None
