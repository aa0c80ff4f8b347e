"""``EmbeddedMongo``: one mongod as a single-node replica set on 127.0.0.1."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import quote

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from outboxkit.embedded._process import (
    ManagedServer,
    ServerProcess,
    free_port,
    spawn,
    stop_process,
    wait_until,
)
from outboxkit.embedded.mongodb._binary import find_mongod

REPLICA_SET = "rs0"

#: Stop modes, named as :class:`~outboxkit.embedded.postgres.EmbeddedPostgres` names them:
#: ``fast`` is SIGTERM (a clean shutdown), ``immediate`` is SIGKILL (a crash; the journal is
#: replayed at the next start, and nothing a client saw committed is lost).
StopMode = Literal["fast", "immediate"]
_STOP_SIGNALS: dict[StopMode, int] = {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}

#: WiredTiger's journal files: 20 MB each and not preallocated (mongod's defaults, 100 MB and
#: three preallocated, cost 300 MB of disk per throwaway server). Durability is the same: a
#: commit with the default write concern (``majority``, journaled) is synced before it returns.
_JOURNAL_CONFIG = "log=(file_max=20MB,prealloc=false)"


class EmbeddedMongo(ManagedServer, ServerProcess):
    """One mongod, a single-node replica set ``rs0``, with its data in ``data_dir`` (a new
    temporary directory by default) and on a free port of 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The server dies with this
    process, even on SIGKILL. Settings suit throwaway servers: a 0.25 GB WiredTiger cache, small
    journal files, no diagnostic data capture. ``transaction_lifetime_limit_seconds`` (mongod's
    default 60; a SIGKILLed writer's transaction then held its locks for 90 s in a test) bounds
    how long a transaction whose client died keeps its write locks;
    ``ttl_monitor_sleep_seconds`` (default 60) is how often TTL indexes are swept; ``parameters``
    are passed as more ``--setParameter name=value``. ``fetch`` downloads mongod if it is
    missing (see :func:`find_mongod`)."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        binary: Path | None = None,
        fetch: bool = False,
        transaction_lifetime_limit_seconds: int | None = None,
        ttl_monitor_sleep_seconds: int | None = None,
        parameters: Mapping[str, str] | None = None,
    ) -> None:
        self.binary = binary or find_mongod(fetch=fetch)
        self._owns_dir = data_dir is None
        self.base_dir = Path(data_dir or tempfile.mkdtemp(prefix="outboxkit-mongo-"))
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "mongod.log"
        self.port = port or free_port()
        self.parameters = {"diagnosticDataCollectionEnabled": "false"}
        if transaction_lifetime_limit_seconds is not None:
            self.parameters["transactionLifetimeLimitSeconds"] = str(
                transaction_lifetime_limit_seconds
            )
        if ttl_monitor_sleep_seconds is not None:
            self.parameters["ttlMonitorSleepSecs"] = str(ttl_monitor_sleep_seconds)
        self.parameters.update(parameters or {})

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the name the replica set's only member is registered under."""
        return f"127.0.0.1:{self.port}"

    def url(self, database: str = "") -> str:
        """``mongodb://127.0.0.1:<port>/<database>?replicaSet=rs0``: the driver discovers the
        set and, across a restart, waits for the primary instead of failing at once."""
        return f"mongodb://{self.address}/{quote(database)}?replicaSet={REPLICA_SET}"

    def start(self, *, timeout: float = 60.0) -> Self:
        """Start mongod (initiating the replica set the first time) and wait for a primary."""
        if self.running:
            return self
        fresh = not (self.data_dir / "WiredTiger").exists()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.binary),
            "--dbpath",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--bind_ip",
            "127.0.0.1",
            "--replSet",
            REPLICA_SET,
            "--nounixsocket",
            "--wiredTigerCacheSizeGB",
            "0.25",
            "--wiredTigerEngineConfigString",
            _JOURNAL_CONFIG,
        ]
        for name, value in self.parameters.items():
            argv += ["--setParameter", f"{name}={value}"]
        self._process = spawn(argv, log_path=self.log_path)
        what = f"mongod on port {self.port}"
        client: MongoClient[dict[str, Any]] = MongoClient(
            self.address,
            directConnection=True,
            serverSelectionTimeoutMS=500,
            connectTimeoutMS=500,
        )
        try:
            wait_until(
                lambda: _hello(client) is not None,
                timeout=timeout,
                what=what,
                process=self._process,
                log_path=self.log_path,
            )
            if fresh:
                # The set's config lives in the data (the ``local`` database): only a new data
                # directory is initiated; a restart elects its only member again by itself.
                client.admin.command(
                    "replSetInitiate",
                    {"_id": REPLICA_SET, "members": [{"_id": 0, "host": self.address}]},
                )
            wait_until(
                lambda: bool((_hello(client) or {}).get("isWritablePrimary")),
                timeout=timeout,
                what=f"{what} to become primary",
                process=self._process,
                log_path=self.log_path,
            )
        except BaseException:
            self.stop("immediate")
            raise
        finally:
            client.close()
        return self

    def stop(self, mode: StopMode = "fast", *, timeout: float = 30.0) -> None:
        """``fast``: SIGTERM, a clean shutdown. ``immediate``: SIGKILL."""
        if self._process is not None:
            stop_process(self._process, _STOP_SIGNALS[mode], timeout=timeout)
            self._process = None

    def kill(self) -> None:
        """SIGKILL mongod: a crash. :meth:`start` brings it back on the same port and data."""
        self.stop("immediate")

    def restart(self, mode: StopMode = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Kill the server and delete its directory if this object made it."""
        self.stop("immediate")
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _hello(client: MongoClient[dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return client.admin.command("hello")
    except PyMongoError:
        return None
