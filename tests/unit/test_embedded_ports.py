"""Ports for the embedded servers: outside the range outgoing connections take theirs from.

No fixed port numbers: a port a test reserves stays reserved for its worker's lifetime, and
another test run on the machine (a second checkout's, CI's) must not find it taken."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from outboxkit.embedded import _process, free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < ephemeral_start for port in ports)
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # nothing listens there


def test_a_port_something_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        spare = free_port()  # free, and reserved by this process (it may reserve it again)
        candidates = iter([taken, taken, spare])
        monkeypatch.setattr(_process.random, "randrange", lambda *_: next(candidates))
        monkeypatch.setattr(_process, "_handed_out", set())
        assert free_port() == spare


def test_a_port_another_process_reserved_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel test workers each start servers: a port one of them holds (its server stopped
    for a restart, say) is never handed to another."""
    child = subprocess.Popen(
        [sys.executable, "-c", _RESERVE_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        reserved = int(child.stdout.readline())
        spare = free_port()
        candidates = iter([reserved, spare])
        monkeypatch.setattr(_process.random, "randrange", lambda *_: next(candidates))
        monkeypatch.setattr(_process, "_handed_out", set())
        assert free_port() == spare
    finally:
        child.communicate(b"")


#: Reserves a port, prints it and holds it until its standard input closes.
_RESERVE_AND_WAIT = """
import sys
from outboxkit.embedded import free_port
print(free_port(), flush=True)
sys.stdin.read()
"""
