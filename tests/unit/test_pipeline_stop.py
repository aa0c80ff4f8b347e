"""`outboxkit pipeline run` ends after a stop signal even when the query does not stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyspark")

HUNG_DRIVER = """
import sys, time
from outboxkit.core.logs import configure_logging
from outboxkit.pipeline.stopping import stop_on_signals

configure_logging()
stop = stop_on_signals(grace_seconds=0.5)
print("ready", flush=True)
stop.wait()
time.sleep(3600)  # a query.stop() that never returns
"""


def test_a_stop_that_hangs_exits_after_the_grace_with_what_was_running() -> None:
    """Would catch: a driver that outstays its stop until the supervisor's SIGKILL, silently."""
    process = subprocess.Popen(
        [sys.executable, "-c", HUNG_DRIVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert time.monotonic() - started < 10, output
    assert "stop did not finish in time" in output
    assert 'File "<string>", line 10' in output  # where the main thread hung
