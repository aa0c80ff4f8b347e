"""`outboxkit check` against a real MongoDB replica set (the embedded mongod, or
OUTBOXKIT_TEST_MONGO_URL)."""

from __future__ import annotations

import contextlib
import socket
import time
from urllib.parse import urlsplit

from outboxkit.backends.mongodb import check_server
from outboxkit.core.settings import ConnectionSettings
from outboxkit.embedded import free_port
from tests.helpers import run_cli


def test_check_reports_the_replica_set(mongo_url: str, kafka_bootstrap: str) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": mongo_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "",
    }
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    result = run_cli("check", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   database    MongoDB replica set" in result.stdout


def _check_within(url: str, kafka_bootstrap: str, seconds: float) -> str:
    env = {
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "",
    }
    started = time.monotonic()
    result = run_cli("check", env=env)
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert took < seconds, f"{took:.1f} s: {output}"
    assert "TopologyDescription" not in output, output
    return output


def test_nothing_listening_is_named_within_seconds(kafka_bootstrap: str) -> None:
    """#28: an unreachable URL took 12 s and printed the driver's topology dump."""
    port = free_port()
    output = _check_within(f"mongodb://127.0.0.1:{port}/x?replicaSet=rs0", kafka_bootstrap, 8)
    assert f"nothing answers at 127.0.0.1:{port}" in output


def test_another_replica_sets_name_is_named(mongo_url: str, kafka_bootstrap: str) -> None:
    wrong = mongo_url.replace("replicaSet=rs0", "replicaSet=other")
    output = _check_within(wrong, kafka_bootstrap, 8)
    assert "is a member of replica set rs0, not other" in output
    assert "replicaSet=rs0" in output


async def test_the_hosts_are_asked_at_once(mongo_server_url: str) -> None:
    """Every host of the URL is probed (2 s at most) at the same time, and one that refuses the
    connection is not waited for: one after the other, with the driver trying a refused host
    again for the whole probe, a member behind two dead seeds was found after 4 s and three
    hosts that accept connections but never answer were named after 6 s."""
    live = urlsplit(mongo_server_url).netloc
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    with contextlib.ExitStack() as stack:
        silent = []
        for _ in range(3):  # listening, never accepting: connected, but no answer
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            silent.append(f"127.0.0.1:{sock.getsockname()[1]}")
        for hosts, ok, within in [([*dead, live], True, 3.0), (silent, False, 4.5)]:
            settings = ConnectionSettings(
                database_url=f"mongodb://{','.join(hosts)}/x?replicaSet=rs0", connect_timeout=10
            )
            started = time.monotonic()
            result = await check_server(settings)
            took = time.monotonic() - started
            assert result.ok is ok, result
            assert took < within, f"{took:.1f} s: {result}"
