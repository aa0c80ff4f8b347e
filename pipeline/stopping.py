"""A stop that ends: SIGTERM/SIGINT ask the query to stop, and the process exits anyway once
``pipeline_stop_grace`` has passed.

A stop waits for the running micro-batch, and Spark runs a Kafka offset lookup on an
uninterruptible thread: after a broker loss one lookup can take its whole patience (see
``ADMIN_PATIENCE`` in job.py). A supervisor kills a process that overstays (Kubernetes after
30 s, systemd after 90 s) and logs nothing about why. Exiting on our own, before that, says what
was still running. Safe at any point: a batch not committed in the checkpoint is re-run at the
next start, and the sinks skip what they already wrote.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import suppress

import structlog

logger = structlog.get_logger("outboxkit.pipeline")


def stop_on_signals(grace_seconds: float) -> threading.Event:
    """An event set by SIGTERM or SIGINT; from then on, the process has ``grace_seconds``.
    Call it from the main thread.

    Python runs a signal's handler in the main thread, between two of its bytecodes: never
    while the main thread waits in C for an answer from Spark's JVM (a py4j call) that does not
    come, the signal having gone to another thread. So the signal's number is also written to a
    socket (:func:`signal.set_wakeup_fd`, by the interpreter's C handler, in whichever thread
    takes the signal), which a thread of ours reads: the stop is noticed, and the grace runs,
    whatever the main thread is doing."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    threading.Thread(
        target=_watch_signals, args=(reader, writer, stop), name="stop-signals", daemon=True
    ).start()
    threading.Thread(
        target=_exit_after_grace, args=(stop, grace_seconds), name="stop-grace", daemon=True
    ).start()
    return stop


def _watch_signals(reader: socket.socket, writer: socket.socket, stop: threading.Event) -> None:
    """Set ``stop`` when SIGTERM or SIGINT is written to the wake-up socket. (``writer`` is
    kept open here for as long as the interpreter may write to it.)"""
    with reader, writer:
        while not stop.is_set():
            received = reader.recv(64)
            if not received or {signal.SIGTERM, signal.SIGINT} & set(received):
                stop.set()


def _exit_after_grace(stop: threading.Event, grace_seconds: float) -> None:
    stop.wait()
    threading.Event().wait(grace_seconds)
    # Nothing on the way out may wait for a lock another thread holds: a thread stuck inside
    # the logging handler (rendering an exception whose str() calls a JVM that is shutting
    # down) once kept a driver past its grace, its warning waiting for the handler's lock.
    logged = _within(
        1.0,
        lambda: logger.warning(
            "stop did not finish in time; exiting (a batch not committed re-runs at the next "
            "start). Python's threads follow, and Spark's JVM prints its own",
            grace_seconds=grace_seconds,
        ),
    )
    if not logged:
        os.write(2, f"{_WARNING} (grace_seconds={grace_seconds:g})\n".encode())
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # writes to the fd, no lock
    _within(2.0, _jvm_thread_dump)
    _within(1.0, sys.stderr.flush)
    _within(1.0, sys.stdout.flush)
    os._exit(0)


#: The warning as written when the logging handler does not take it within a second.
_WARNING = "stop did not finish in time; exiting, the logging handler stuck"


def _within(seconds: float, action: Callable[[], object]) -> bool:
    """Run ``action`` in a daemon thread; whether it finished within ``seconds``."""
    worker = threading.Thread(target=action, name="stop-grace-step", daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def _jvm_thread_dump() -> None:
    """SIGQUIT makes the JVM print every thread's stack to its stdout (ours) and go on."""
    from pyspark import SparkContext  # noqa: PLC0415

    # The gateway's process is private to pyspark; a dump is a diagnostic, so best effort.
    process = getattr(SparkContext._gateway, "proc", None)
    if process is not None and process.poll() is None:
        with suppress(OSError):
            os.kill(process.pid, signal.SIGQUIT)
            threading.Event().wait(1)  # the dump is written by the JVM, asynchronously
