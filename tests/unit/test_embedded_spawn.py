"""A server started from a thread that then ends keeps running (Linux's parent-death signal
follows the thread that forked the child, not the process)."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest

from outboxkit.embedded._process import spawn, stop_process


def test_a_server_started_from_a_thread_that_ends_keeps_running(tmp_path: Path) -> None:
    """Would catch the broker a test restarts in ``asyncio.to_thread`` SIGKILLed when the
    event loop's executor thread ends (a 3-node cluster then runs on two, and the next broker
    kill leaves writes below ``min.insync.replicas``)."""
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(
        target=lambda: started.append(spawn(["sleep", "30"], log_path=tmp_path / "log"))
    )
    thread.start()
    thread.join()
    (child,) = started
    try:
        # The signal would come as the thread ends: give it time to arrive.
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.5)
    finally:
        stop_process(child, signal.SIGKILL, timeout=5)
