"""A real Spark standalone cluster — one master, N workers — from the installed pyspark.

pyspark's wheel is a whole Spark distribution: ``bin/spark-class`` starts its master
(``org.apache.spark.deploy.master.Master``) and workers (``…deploy.worker.Worker``), each one
JVM on free ports of 127.0.0.1 with its own work directory. An application submitted to
:attr:`SparkCluster.master_url` gets its executors in separate JVMs started by the workers, as
on a real cluster, so a test sees what ``local[*]`` hides: jars shipped from the driver, the
Python executable the executors run, executors lost with their node.

A worker is not the driver's machine: it runs without the driver's virtualenv on ``PATH`` and
without ``PYSPARK_PYTHON``, so executors run the Python the application names
(``spark.pyspark.python``, or the driver's ``PYSPARK_PYTHON``) — or fail, as they would on a
node where ``python3`` lacks the job's packages. :meth:`SparkWorker.kill` is a lost node: the
worker, its executors and their Python workers, all with SIGKILL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any, Self

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded._process import (
    ManagedServer,
    ServerProcess,
    free_port,
    spawn,
    stop_process,
    wait_until,
)
from outboxkit.embedded.spark_jvm import quick_jvm_options, spark_environment

__all__ = [
    "SparkCluster",
    "SparkMaster",
    "SparkWorker",
    "spark_bin",
    "spark_home",
    "submit_command",
]

#: The daemons' own settings (their ``--properties-file``). The master's REST submission
#: server would take a fixed port (6066) that two clusters share.
_DEFAULTS = {
    "spark.master.rest.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def spark_home() -> Path:
    """The installed pyspark package: a Spark distribution (``bin/``, ``jars/``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "the embedded Spark cluster needs pyspark: pip install 'outboxkit[spark]'"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def spark_bin(name: str) -> Path:
    """``spark-class``, ``spark-submit``… of the installed pyspark."""
    return spark_home() / "bin" / name


def _node_environment(base: dict[str, str], java_options: str) -> dict[str, str]:
    if shutil.which("java") is None:
        raise ConfigurationError("Spark needs Java 17: apt-get install openjdk-17-jre-headless")
    return {
        # No SPARK_CONF_DIR: the settings come with --properties-file, so that the JVMs can
        # map the class archive (outboxkit.embedded.spark_jvm).
        **spark_environment(base),
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        # The master and the workers only schedule and supervise: C1-compiled code, the serial
        # collector and the class archive start them faster on a busy machine. Executors take
        # the application's spark.executor.extraJavaOptions.
        "SPARK_DAEMON_JAVA_OPTS": java_options,
    }


def _without_virtualenv(env: dict[str, str]) -> dict[str, str]:
    """``env`` as a worker node has it: no virtualenv on ``PATH``, no ``PYSPARK_PYTHON``."""
    venv_bins = {str(Path(sys.prefix) / "bin")} if sys.prefix != sys.base_prefix else set()
    if "VIRTUAL_ENV" in env:
        venv_bins.add(str(Path(env["VIRTUAL_ENV"]) / "bin"))
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venv_bins]
    cleaned = {
        k: v
        for k, v in env.items()
        if k not in {"VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH"}
    }
    return {**cleaned, "PATH": os.pathsep.join(path)}


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren…), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses; split after the last ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class SparkMaster(ServerProcess):
    """The standalone master: schedules applications' executors on the live workers."""

    def __init__(self, cluster: SparkCluster) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.webui_port = free_port()
        self.log_path = cluster.base_dir / "master.log"

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications), as its web UI serves it."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            status: dict[str, Any] = json.load(response)
        return status

    def _alive(self) -> bool:
        try:
            return self.status().get("status") == "ALIVE"
        except (OSError, ValueError):  # not listening yet, or not serving JSON yet
            return False

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        self._process = spawn(
            [
                str(spark_bin("spark-class")),
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", str(self.webui_port)),
                *("--properties-file", str(self.cluster.properties_file)),
            ],
            log_path=self.log_path,
            env=_node_environment(dict(os.environ), self.cluster.daemon_java_options),
        )
        wait_until(
            self._alive,
            timeout=timeout,
            what=f"Spark master on port {self.port}",
            process=self._process,
            log_path=self.log_path,
        )

    def kill(self) -> None:
        if self._process is not None:
            stop_process(self._process, signal.SIGKILL, timeout=10)
            self._process = None


class SparkWorker(ServerProcess):
    """One worker: offers ``cores`` and ``memory`` to the master, starts executors (JVMs of
    their own, each with its Python workers) in ``work_dir/<app id>/<executor id>/``."""

    def __init__(self, cluster: SparkCluster, number: int) -> None:
        self.cluster = cluster
        self.number = number
        self.port = free_port()
        self.webui_port = free_port()
        self.dir = cluster.base_dir / f"worker{number}"
        self.work_dir = self.dir / "work"
        self.log_path = self.dir / "worker.log"

    @property
    def address(self) -> str:
        """``host:port`` the master knows this worker by."""
        return f"127.0.0.1:{self.port}"

    def launch(self) -> None:
        if self.running:
            return
        local_dir = self.dir / "local"  # executors' shuffle and block files
        local_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = _node_environment(
            _without_virtualenv(dict(os.environ)), self.cluster.daemon_java_options
        )
        env["SPARK_LOCAL_DIRS"] = str(local_dir)
        self._process = spawn(
            [
                str(spark_bin("spark-class")),
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", str(self.webui_port)),
                *("--cores", str(self.cluster.worker_cores)),
                *("--memory", self.cluster.worker_memory),
                *("--work-dir", str(self.work_dir)),
                *("--properties-file", str(self.cluster.properties_file)),
                self.cluster.master_url,
            ],
            log_path=self.log_path,
            env=env,
        )

    def registered(self) -> bool:
        """Whether the master counts this worker as alive."""
        try:
            workers = self.cluster.master.status().get("workers", [])
        except (OSError, ValueError):  # not listening yet, or not serving JSON yet
            return False
        return any(
            w.get("state") == "ALIVE" and f"{w.get('host')}:{w.get('port')}" == self.address
            for w in workers
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_until(
            self.registered,
            timeout=timeout,
            what=f"Spark worker {self.number} on port {self.port}",
            process=self._process,
            log_path=self.log_path,
        )

    def start(self, timeout: float = 60.0) -> None:
        """Start (again) on the same port and work directory, registered with the master."""
        if self.running:
            return
        self.launch()
        self.wait_ready(timeout)

    def executor_dirs(self, app_id: str | None = None) -> list[Path]:
        """The directories of the executors this worker started (of ``app_id``, or all)."""
        pattern = f"{app_id}/*" if app_id else "app-*/*"
        return sorted(p for p in self.work_dir.glob(pattern) if p.is_dir())

    def stop(self, *, timeout: float = 30.0) -> None:
        """SIGTERM: the worker stops its executors and leaves the master."""
        if self._process is not None:
            stop_process(self._process, signal.SIGTERM, timeout=timeout)
            self._process = None

    def kill(self) -> None:
        """A lost node: SIGKILL the worker, its executors and their Python workers at once."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGSTOP)  # no new child while they are listed
            for pid in [process.pid, *_descendants(process.pid)]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        process.wait(10)
        self._process = None


class SparkCluster(ManagedServer):
    """A master and ``workers`` workers of ``worker_cores`` cores and ``worker_memory`` each,
    files under ``base_dir`` (a temporary directory by default). Use as a context manager, or
    :meth:`start` / :meth:`close`.

    An application's executors default to 1 GiB (``spark.executor.memory``): a worker offers
    1 GiB by default, so each worker runs one executor of ``worker_cores`` cores."""

    def __init__(
        self,
        workers: int = 2,
        *,
        base_dir: Path | None = None,
        worker_cores: int = 1,
        worker_memory: str = "1g",
    ) -> None:
        if workers < 1:
            raise ConfigurationError("a Spark cluster needs at least one worker")
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="outboxkit-spark-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.properties_file = self.base_dir / "spark-defaults.conf"
        #: The daemons' JVM options (``SPARK_DAEMON_JAVA_OPTS``), set by :meth:`start`.
        self.daemon_java_options = ""
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.master = SparkMaster(self)
        self.workers = [SparkWorker(self, n + 1) for n in range(workers)]

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: what ``--master`` takes."""
        return self.master.url

    def start(self, timeout: float = 90.0) -> Self:
        self.properties_file.write_text("".join(f"{k} {v}\n" for k, v in _DEFAULTS.items()))
        self.daemon_java_options = quick_jvm_options()
        self.master.start(timeout)
        for worker in self.workers:
            worker.launch()
        with ThreadPoolExecutor(len(self.workers)) as pool:
            list(pool.map(lambda w: w.wait_ready(timeout), self.workers))
        return self

    def applications(self) -> list[dict[str, Any]]:
        """The master's running applications (id, name, cores, state…)."""
        apps: list[dict[str, Any]] = self.master.status().get("activeapps", [])
        return apps

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.master.kill()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def submit_command(cluster: SparkCluster, *arguments: str) -> list[str]:
    """``spark-submit --master <the cluster> <arguments>`` of the installed pyspark."""
    return [str(spark_bin("spark-submit")), "--master", cluster.master_url, *arguments]


def _main() -> None:  # pragma: no cover - manual use: python -m outboxkit.embedded.spark_cluster
    with SparkCluster() as cluster:
        print(cluster.master_url, flush=True)
        with suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    _main()
