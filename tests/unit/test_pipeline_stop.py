"""`outboxkit pipeline run` ends after a stop signal even when the query does not stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyspark")

#: What each driver below starts with: a stop on SIGTERM with a 0.5 s grace (lines 1-7).
PRELUDE = """
import logging, os, signal, threading
from outboxkit.core.logs import configure_logging
from outboxkit.pipeline.stopping import stop_on_signals

configure_logging()
stop = stop_on_signals(grace_seconds=0.5)
"""

HUNG_DRIVER = f"""{PRELUDE}print("ready", flush=True)
stop.wait()
threading.Event().wait()  # a query.stop() that never returns
"""


def _stopped(driver: str) -> str:
    """The output of ``driver`` (a script that prints "ready" once it may be stopped) given
    SIGTERM then: it exited 0, within 10 s."""
    process = subprocess.Popen(
        [sys.executable, "-c", driver],
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
    return output


def test_a_stop_that_hangs_exits_after_the_grace_with_what_was_running() -> None:
    """Would catch: a driver that outstays its stop until the supervisor's SIGKILL, silently."""
    output = _stopped(HUNG_DRIVER)
    assert "stop did not finish in time" in output
    assert 'File "<string>", line 10' in output  # where the main thread hung


STUCK_LOGGING_DRIVER = f"""{PRELUDE}[handler] = logging.getLogger().handlers

def hold():  # the lock taken by a thread that stays inside the handler
    handler.acquire()
    threading.Event().wait()

threading.Thread(target=hold, daemon=True).start()
print("ready", flush=True)
stop.wait()
threading.Event().wait()
"""


def test_a_stop_exits_after_the_grace_even_when_the_logging_handler_is_stuck() -> None:
    """Would catch: a driver kept past its grace by its own warning, waiting for the lock of
    a logging handler that another thread holds (seen in test_spark_cluster.py: a thread
    rendering an exception that called into a JVM shutting down)."""
    output = _stopped(STUCK_LOGGING_DRIVER)
    assert "stop did not finish in time; exiting, the logging handler stuck" in output
    assert 'File "<string>", line 17' in output  # where the main thread hung


BLOCKED_MAIN_DRIVER = f"""{PRELUDE}threading.Thread(target=threading.Event().wait).start()
# From here the signal goes to another thread, and the main thread waits in C, as in a py4j
# call whose answer does not come: Python never gets to run its handler.
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
reader, _ = os.pipe()
print("ready", flush=True)
os.read(reader, 1)
"""


def test_a_stop_is_noticed_while_the_main_thread_waits_in_c() -> None:
    """Would catch: a stop signal whose Python handler waits for the main thread, stuck in a
    py4j call to a JVM that does not answer: no stop, no grace, the driver up until SIGKILL."""
    output = _stopped(BLOCKED_MAIN_DRIVER)
    assert "stop did not finish in time" in output
    assert 'File "<string>", line 14' in output  # where the main thread waits


class _StoppedQuery:
    """A query whose JVM went away during the stop (SIGTERM to the whole process group)."""

    name = "test"
    id = "q"
    isActive = True

    def __init__(self, error: Exception) -> None:
        self.error = error

    def stop(self) -> None:
        raise self.error


class _GoneStreams:
    def addListener(self, listener: object) -> None:
        pass

    def removeListener(self, listener: object) -> None:
        raise ConnectionRefusedError(111, "Connection refused")  # py4j's new connection


@pytest.mark.parametrize(
    "error",
    [ConnectionRefusedError(111, "Connection refused"), "py4j"],
    ids=["new-connection", "open-connection"],
)
def test_a_stop_that_the_jvm_ended_first_is_a_stop(
    error: Exception | str, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Would catch: a driver that exits 1 ("error: [Errno 111] Connection refused") after
    SIGTERM to its process group, when py4j opens a new connection to the JVM already gone
    (a ConnectionRefusedError, not a Py4JError) — seen in tests/integration/test_spark_cluster.py
    when the signal landed during an offset lookup."""
    import threading  # noqa: PLC0415

    from py4j.protocol import Py4JNetworkError  # type: ignore[import-untyped]  # noqa: PLC0415

    from outboxkit.pipeline import job  # noqa: PLC0415
    from outboxkit.pipeline.settings import PipelineSettings  # noqa: PLC0415
    from outboxkit.schemas import EventRegistry  # noqa: PLC0415

    raised = Py4JNetworkError("Answer from Java side is empty") if error == "py4j" else error
    assert isinstance(raised, Exception)
    monkeypatch.setattr(job, "configure_session", lambda *_, **__: None)
    monkeypatch.setattr(job, "start", lambda *_, **__: _StoppedQuery(raised))
    spark = type("Spark", (), {"streams": _GoneStreams()})()
    settings = PipelineSettings(
        kafka_bootstrap_servers="127.0.0.1:9", pipeline_output=str(tmp_path)
    )
    stop = threading.Event()
    stop.set()
    report = job.run(job.Pipeline(EventRegistry(), []), settings, spark=spark, stop=stop)
    assert (report.name, report.batches) == ("test", 0)
