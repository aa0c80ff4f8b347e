"""Starting and watching local server processes (PostgreSQL, Kafka) for tests and the demo."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import fcntl
import functools
import os
import pwd
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from outboxkit.core.exceptions import OutboxkitError

_PR_SET_PDEATHSIG = 1


class ServerStartError(OutboxkitError):
    """A local server did not start."""


#: Ports this process handed out: two servers started together never get the same one.
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a server to bind.

    Chosen below the kernel's ephemeral range, which every outgoing connection draws from: a
    port from that range could be taken by a client (of this test run's many) between this
    check and the server's bind, or while a server restarts on it. A port is also reserved for
    this process's lifetime against every other process that asks here (parallel test workers,
    two ``outboxkit dev up``): a stopped server's port stays its own until it starts again."""
    low = _ephemeral_range_start()
    for _ in range(200):
        port = random.randrange(max(low - 12000, 1024), low)
        if port not in _handed_out and _bind(port) and _reserve(port):
            break
    else:
        port = _bind(0)  # all taken: any port the kernel gives
    _handed_out.add(port)
    return port


@functools.cache
def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


@functools.cache
def _reservations() -> int | None:
    """One file whose byte *n* is locked by the process that reserved port *n*. POSIX record
    locks are per process, released by the kernel when it exits (even by SIGKILL) and never
    inherited by a child, so one descriptor holds any number of reservations; None if the
    file cannot be opened (then ports are distinct within this process only)."""
    path = Path(tempfile.gettempdir()) / "outboxkit-ports.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # another user's run may reserve ports too
    return fd


def _reserve(port: int) -> bool:
    """Reserve ``port`` for this process; False if another process holds it."""
    fd = _reservations()
    if fd is None:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
    except OSError:
        return False
    return True


def _bind(port: int) -> int:
    """Bind ``port`` (0: any) for a moment; the port bound, or 0 if it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return 0
        return int(sock.getsockname()[1])


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def die_with_parent() -> None:
    """Runs in the child before exec: if the Python process dies (even by SIGKILL), so does the
    server, so a killed test run leaves no broker or database behind.

    Linux sends the signal when the *thread* that forked the child ends, not the process: a
    child started from a short-lived thread (``asyncio.to_thread``, a thread pool an event loop
    shuts down) would die with that thread. :func:`spawn` forks from one thread that lives as
    long as the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


#: The one thread servers are forked from (see :func:`die_with_parent`); it ends only with the
#: interpreter, whose exit then ends the servers too.
_forker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="outboxkit-spawn")


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    user: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output in ``log_path``, tied to this process's life (whichever
    thread asks), in a process group of its own.

    Its own group: a terminal's Ctrl-C signals the whole foreground process group, and a
    server in it stopped at once, before the Python process that started it could stop what
    uses the server first (the example runner's apps lost their PostgreSQL mid-shutdown and
    logged a connection error every few milliseconds). The server is this process's to stop
    (its ``close()``), or dies with it."""
    log = log_path.open("ab")
    try:
        return _forker.submit(
            subprocess.Popen,
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            user=user,
            # Drop root's groups too: with gid 0 left, root-owned 0701 directories would be
            # judged by their (empty) group bits instead of the "other" bits.
            group=primary_group(user),
            extra_groups=[] if user else None,
            env=env,
            process_group=0,
            preexec_fn=die_with_parent,  # only prctl, before exec
        ).result()
    finally:
        log.close()


def primary_group(user: str | None) -> int | None:
    return pwd.getpwnam(user).pw_gid if user else None


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    process: subprocess.Popen[Any] | None = None,
    log_path: Path | None = None,
) -> None:
    """Poll ``condition`` until it holds; fail early if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise ServerStartError(
                f"{what}: process exited with {process.returncode}{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise ServerStartError(f"{what}: not ready after {timeout:.0f} s{_tail(log_path)}")
        time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes], sig: int, *, timeout: float) -> None:
    """Send ``sig`` and wait; SIGKILL if it does not exit in time."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


def _tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    text = log_path.read_text(errors="replace").splitlines()[-lines:]
    return "\n--- last lines of " + str(log_path) + " ---\n" + "\n".join(text)


def make_traversable(path: Path) -> None:
    """Let another user reach ``path``: add o+x to it and every parent (a server that must not
    run as root needs to reach its binaries and data directory)."""
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if not mode & 0o001:
            os.chmod(part, mode | 0o001)


class ServerProcess:
    """A server that runs as one child process (``_process``, set by ``start``)."""

    _process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process else None


class ManagedServer:
    """A server object used as ``with Server() as server:``: ``start()`` on entry, ``close()``
    (stop, and delete what it made) on exit."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
