"""Small helpers shared by the test tiers."""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx


async def wait_for(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    within: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Wait until ``condition`` holds, or fail after ``within`` seconds. Never a bare sleep."""
    deadline = time.monotonic() + within
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(interval)


async def holds_for(
    seconds: float, check: Callable[[], Awaitable[None]], *, interval: float = 0.25
) -> None:
    """Run ``check`` (which asserts) every ``interval`` for ``seconds``: something must *not*
    happen during a window, so there is no condition to wait for."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        await check()
        await asyncio.sleep(interval)


class LosesOneCancellation:
    """A driver call that loses a cancellation, as pymongo's can on Python 3.11
    (``asyncio.wait_for``: core/waiting.py): each call waits until cancelled, and the first one
    then returns as if it had not been (``lost``)."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.lost = False

    async def __call__(self) -> None:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost = True

    async def assert_ends_when_cancelled(
        self, work: Coroutine[Any, Any, None], what: str = "the side task"
    ) -> None:
        """Run ``work`` until it makes this call, cancel it there, and assert that it ends
        within 2 s all the same."""
        task = asyncio.create_task(work)
        await asyncio.wait_for(self.called.wait(), 2)
        task.cancel()
        await asyncio.wait([task], timeout=2)
        assert self.lost
        assert task.cancelled(), f"{what} ran on after its cancellation"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def http_client(**kwargs: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` on one TLS context shared by every client of the process.

    httpx loads certifi's CA bundle into a new context for each client it makes: ~40 ms of
    CPU, paid even for plain HTTP. The tests poll the workers' ``/healthz`` and ``/metrics``
    with a client each time, up to 150 times a second, which kept a core busy by itself."""
    return httpx.AsyncClient(verify=_tls_context(), **kwargs)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ``outboxkit`` command of this interpreter's installation."""
    return subprocess.run(
        [sys.executable, "-m", "outboxkit", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


#: The worker processes (relays, inboxes) the running test started: killed when it ends,
#: whatever became of the code that should have stopped them (:func:`kill_leftover_workers`).
_started: list[subprocess.Popen[bytes]] = []


def started_worker(process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Note a worker process the running test started (see :func:`kill_leftover_workers`)."""
    _started.append(process)
    return process


def kill_leftover_workers() -> list[str]:
    """Kill the worker processes the test started and left running; their command lines.

    A test that times out (pytest-timeout raises out of the event loop) or fails before its
    cleanup leaves its ``async with`` blocks unfinished: their relays and inboxes would keep
    retrying against servers the test has stopped, on the CPU of every later test of the run
    (a failover test's five processes ran for 20 minutes so)."""
    left = []
    for process in _started:
        if process.poll() is None:
            process.kill()
            process.wait(10)
            left.append(" ".join(map(str, process.args)))  # type: ignore[arg-type]
    _started.clear()
    return left


def mapped_class_archives(pid: int) -> set[str]:
    """The class-data-sharing archives the JVM ``pid`` has mapped: the JDK's own, and the one
    :mod:`outboxkit.embedded.class_archive` made, unless the JVM could not use it (then it
    starts without it, only slower)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if line.endswith(".jsa")}
