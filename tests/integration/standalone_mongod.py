"""A mongod started without ``--replSet`` (a standalone), as some users run one: outboxkit must
refuse it with one line (tests/integration/test_mongodb_standalone.py); with ``--auth``, it is
also the cheapest server that refuses a login (tests/integration/test_refused_logins.py)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from outboxkit.embedded._process import free_port, spawn, stop_process, wait_until
from outboxkit.embedded.mongodb import find_mongod


@contextlib.contextmanager
def standalone_mongod(base: Path, *options: str) -> Iterator[int]:
    """A standalone mongod on a free port of 127.0.0.1 (its data and log in ``base``), with
    ``options`` added to its command line; its port. Stopped afterwards."""
    port = free_port()
    data = base / "mongo"
    data.mkdir()
    log = base / "mongod.log"
    argv = [str(find_mongod(fetch=True)), "--dbpath", str(data), "--port", str(port)]
    argv += ["--bind_ip", "127.0.0.1", "--nounixsocket", "--wiredTigerCacheSizeGB", "0.25"]
    process = spawn([*argv, *options], log_path=log)
    client: MongoClient[dict[str, object]] = MongoClient(
        f"127.0.0.1:{port}", directConnection=True, serverSelectionTimeoutMS=500
    )

    def answers() -> bool:
        try:
            client.admin.command("ping")  # needs no login, even with --auth
        except PyMongoError:
            return False
        return True

    try:
        wait_until(answers, timeout=60, what="standalone mongod", process=process, log_path=log)
        yield port
    finally:
        client.close()
        stop_process(process, signal.SIGTERM, timeout=30)
