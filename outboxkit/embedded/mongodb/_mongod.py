"""One ``mongod`` process of a replica set on 127.0.0.1: what a single-node set and each member
of a three-member set share (the command line, the start, the stop)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from outboxkit.embedded._process import ServerProcess, spawn, stop_process, wait_until

if TYPE_CHECKING:  # pymongo is imported when a mongod starts, not with the testing plugin
    from pymongo import MongoClient

#: Stop modes, named as :class:`~outboxkit.embedded.postgres.EmbeddedPostgres` names them:
#: ``fast`` is SIGTERM (a clean shutdown), ``immediate`` is SIGKILL (a crash; the journal is
#: replayed at the next start, and nothing a client saw committed is lost).
StopMode = Literal["fast", "immediate"]
_STOP_SIGNALS: dict[StopMode, int] = {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}

#: WiredTiger's journal files: 20 MB each and not preallocated (mongod's defaults, 100 MB and
#: three preallocated, cost 300 MB of disk per throwaway server). Durability is the same: a
#: commit with the default write concern (``majority``, journaled) is synced before it returns.
_JOURNAL_CONFIG = "log=(file_max=20MB,prealloc=false)"

Hello = dict[str, Any]


def mongod_parameters(
    transaction_lifetime_limit_seconds: int | None,
    ttl_monitor_sleep_seconds: int | None,
    parameters: Mapping[str, str] | None,
) -> dict[str, str]:
    """The ``--setParameter`` options of a throwaway mongod: no diagnostic data capture, and the
    given limits (see :class:`~outboxkit.embedded.mongodb.EmbeddedMongo`)."""
    chosen = {"diagnosticDataCollectionEnabled": "false"}
    if transaction_lifetime_limit_seconds is not None:
        chosen["transactionLifetimeLimitSeconds"] = str(transaction_lifetime_limit_seconds)
    if ttl_monitor_sleep_seconds is not None:
        chosen["ttlMonitorSleepSecs"] = str(ttl_monitor_sleep_seconds)
    chosen.update(parameters or {})
    return chosen


class Mongod(ServerProcess):
    """``mongod --replSet <replica_set>`` on ``port`` with its data in ``base_dir/data``: a
    0.25 GB WiredTiger cache and small journal files. It keeps its port and data across
    :meth:`stop`, :meth:`kill` and a new :meth:`spawn`, and dies with this process."""

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int,
        binary: Path,
        replica_set: str,
        parameters: dict[str, str],
    ) -> None:
        self.binary = binary
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "mongod.log"
        self.port = port
        self.replica_set = replica_set
        self.parameters = parameters

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the name the member is registered under in its set."""
        return f"127.0.0.1:{self.port}"

    @property
    def fresh(self) -> bool:
        """Whether the data directory is new (the set's config lives in the data)."""
        return not (self.data_dir / "WiredTiger").exists()

    def spawn(self, *, timeout: float) -> None:
        """Start mongod and wait until it answers (as whatever member it is, if any)."""
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
            self.replica_set,
            "--nounixsocket",
            "--wiredTigerCacheSizeGB",
            "0.25",
            "--wiredTigerEngineConfigString",
            _JOURNAL_CONFIG,
        ]
        for name, value in self.parameters.items():
            argv += ["--setParameter", f"{name}={value}"]
        self._process = spawn(argv, log_path=self.log_path)
        try:
            self.wait(lambda hello: hello is not None, timeout=timeout, what="to answer")
        except BaseException:
            self.stop("immediate")
            raise

    def client(self) -> MongoClient[dict[str, Any]]:
        """A client of this mongod alone (not of its set), quick to give up."""
        from pymongo import MongoClient  # noqa: PLC0415 - see the imports

        return MongoClient(
            self.address,
            directConnection=True,
            serverSelectionTimeoutMS=500,
            connectTimeoutMS=500,
        )

    def hello(self) -> Hello | None:
        """mongod's ``hello`` answer, or None if it does not answer."""
        if not self.running:
            return None
        with self.client() as client:
            return _hello(client)

    def wait(
        self,
        condition: Callable[[Hello | None], object],
        *,
        timeout: float,
        what: str,
        client: MongoClient[dict[str, Any]] | None = None,
    ) -> None:
        """Wait until ``condition(hello answer or None)`` holds; fail early if mongod exits."""
        own = client is None
        client = client or self.client()
        try:
            wait_until(
                lambda: bool(condition(_hello(client))),
                timeout=timeout,
                what=f"mongod on port {self.port} {what}",
                process=self._process,
                log_path=self.log_path,
            )
        finally:
            if own:
                client.close()

    def stop(self, mode: StopMode = "fast", *, timeout: float = 30.0) -> None:
        """``fast``: SIGTERM, a clean shutdown. ``immediate``: SIGKILL."""
        if self._process is not None:
            stop_process(self._process, _STOP_SIGNALS[mode], timeout=timeout)
            self._process = None

    def kill(self) -> None:
        """SIGKILL mongod: a crash. Starting it again brings it back on the same port and data."""
        self.stop("immediate")


def _hello(client: MongoClient[dict[str, Any]]) -> Hello | None:
    from pymongo.errors import PyMongoError  # noqa: PLC0415 - see the imports

    try:
        return client.admin.command("hello")
    except PyMongoError:
        return None
