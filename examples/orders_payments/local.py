"""Both services on this machine with no external services: an embedded PostgreSQL (one
database per service), the embedded Tansu broker (``--broker kafka``: Apache Kafka from the
jars in ~/.cache/outboxkit), and each app under uvicorn. Ctrl-C stops everything, in order: the
apps first (each drains its relay and inbox), then the broker and the database they used.

    python -m examples.orders_payments.local
    curl -sS -w '\\n' localhost:8001/orders -H 'content-type: application/json' \\
         -d '{"customer_id": "c-1", "lines": [{"sku": "tea", "quantity": 2, "unit_price": "3.25"}]}'
    curl -sS -w '\\n' localhost:8001/orders/<order_id>  # "status": "paid" a moment later

:func:`serve` is the part that does not depend on the database; the MongoDB services' runner
(``examples.orders_payments_mongodb.local``) uses it too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import psycopg
import uvicorn.config

from outboxkit.embedded import (
    EmbeddedPostgres,
    EmbeddedTansu,
    KafkaCluster,
    create_topics,
    die_with_parent,
)

SERVICES = ("orders", "payments")
TOPICS = ["shop.orders", "shop.payments", "shop.orders.dlq", "shop.payments.dlq"]
REPO = Path(__file__).resolve().parents[2]
KAFKA_JARS = Path.home() / ".cache" / "outboxkit" / "kafka-4.4.0"
#: Seconds an app may take to stop (uvicorn's graceful shutdown: the inbox and the relay drain
#: and leave their groups) before it is killed.
APP_STOP_TIMEOUT = 30.0


@contextlib.contextmanager
def broker(kind: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The bootstrap address, and the settings the broker needs."""
    if kind == "kafka":
        with KafkaCluster(1, jars_dir=KAFKA_JARS) as cluster:
            yield cluster.bootstrap_servers, {}
    else:
        # Tansu has no transactions nor idempotent producers: the relay publishes without
        # fencing (G4 weakens: a frozen relay may re-send after a takeover; the inbox absorbs
        # the duplicates). See docs/demo.md.
        with EmbeddedTansu() as tansu:
            yield (
                tansu.bootstrap_servers,
                {
                    "OUTBOXKIT_TRANSACTIONAL": "false",
                    "OUTBOXKIT_DLQ_IDEMPOTENCE": "false",
                },
            )


def arguments(doc: str) -> argparse.Namespace:
    """The runner's options; SIGTERM stops it as Ctrl-C does."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--broker", choices=["tansu", "kafka"], default="tansu")
    parser.add_argument("--orders-port", type=int, default=8001)
    parser.add_argument("--payments-port", type=int, default=8002)
    return parser.parse_args()


def wait_until_ready(apps: Mapping[int, subprocess.Popen[bytes]], within: float = 120.0) -> None:
    """Wait until every app (by port) answers ``/healthz`` with 200: its database is prepared,
    its topic registered, its relay and inbox running. :class:`SystemExit` if one exits first
    or the deadline passes, so that the banner never announces a service that cannot work."""
    deadline = time.monotonic() + within
    waiting = dict(apps)
    while waiting:
        for port, app in list(waiting.items()):
            if app.poll() is not None:
                raise SystemExit(f"the service on :{port} exited with {app.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    del waiting[port]  # 200; a 503 raises HTTPError
            except (urllib.error.URLError, OSError):
                pass
        if waiting and time.monotonic() > deadline:
            ports = ", ".join(f":{port}" for port in waiting)
            raise SystemExit(f"not ready within {within:.0f} s: the service on {ports}")
        if waiting:
            time.sleep(0.2)


class SkipHealthChecks(logging.Filter):
    """Leaves ``/healthz`` out of uvicorn's access log: :func:`wait_until_ready` asks for it
    every 0.2 s until the services are ready, and each 503 would be a line before the banner
    (a probe of an orchestrator would fill the log the same way). Every other request is
    logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        path = str(args[2]) if len(args) > 2 else ""  # (client, method, path, version, status)
        return path.partition("?")[0] != "/healthz"


def uvicorn_log_config(directory: Path) -> Path:
    """uvicorn's own logging configuration, with :class:`SkipHealthChecks` on its access log."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["filters"] = {"skip_health_checks": {"()": f"{_MODULE}.SkipHealthChecks"}}
    config["handlers"]["access"]["filters"] = ["skip_health_checks"]
    path = directory / "uvicorn-logging.json"
    path.write_text(json.dumps(config))
    return path


#: This module's name also when it runs as ``python -m`` (then it is ``__main__``).
_MODULE = "examples.orders_payments.local"


def serve(package: str, database_urls: Mapping[str, str], args: argparse.Namespace) -> None:
    """Start the broker and its topics, then ``<package>.orders`` and ``<package>.payments``
    under uvicorn, each on its own database (``database_urls`` by service); until Ctrl-C."""
    with (
        broker(args.broker) as (bootstrap, broker_env),
        tempfile.TemporaryDirectory(prefix="outboxkit-example-") as workdir,
    ):
        log_config = uvicorn_log_config(Path(workdir))
        asyncio.run(create_topics(bootstrap, dict.fromkeys(TOPICS, 3)))
        # The consoles' login: one token for this run (or yours), printed with the banner, so
        # that no page of a running app is open to whoever reaches its port.
        token = os.environ.get("OUTBOXKIT_CONSOLE_TOKEN") or secrets.token_urlsafe(12)
        apps: dict[int, subprocess.Popen[bytes]] = {}
        for name, port in (("orders", args.orders_port), ("payments", args.payments_port)):
            env = {
                **os.environ,
                **broker_env,
                "OUTBOXKIT_DATABASE_URL": database_urls[name],
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "OUTBOXKIT_CONSOLE_TOKEN": token,
                "PYTHONPATH": str(REPO),
            }
            command = [sys.executable, "-m", "uvicorn", "--factory", "--port", str(port)]
            command += ["--log-config", str(log_config)]
            apps[port] = subprocess.Popen(
                [*command, f"{package}.{name}:create_app"],
                env=env,
                # Out of the terminal's process group, as the servers are: Ctrl-C reaches this
                # runner alone, which stops the apps before the servers they use.
                process_group=0,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, before exec
            )
        try:
            wait_until_ready(apps)
            # Flushed at once: a script that reads this line may send its first order then.
            print(
                f"consoles at http://localhost:{args.orders_port}/outboxkit/ and "
                f"http://localhost:{args.payments_port}/outboxkit/ (token {token})\n"
                f"orders on :{args.orders_port}, payments on :{args.payments_port} — ready; "
                "Ctrl-C stops",
                flush=True,
            )
            signal.pause()
        finally:
            stop_apps(apps.values())


def stop_apps(apps: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every app (uvicorn's graceful shutdown), and wait for them all; one that
    outlives :data:`APP_STOP_TIMEOUT` is killed. Another Ctrl-C meanwhile changes nothing: the
    apps must be gone before their database and broker stop."""
    _ignore_interrupts()
    running = [app for app in apps if app.poll() is None]
    for app in running:
        app.terminate()
    deadline = time.monotonic() + APP_STOP_TIMEOUT
    for app in running:
        try:
            app.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            print(f"an app did not stop within {APP_STOP_TIMEOUT:.0f} s: killed", flush=True)
            app.kill()
            app.wait()


def main() -> None:
    args = arguments(__doc__)
    with stopped_by_ctrl_c(), EmbeddedPostgres() as pg:
        for db in SERVICES:
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {db}")
        serve("examples.orders_payments", {db: pg.url(db) for db in SERVICES}, args)


@contextlib.contextmanager
def stopped_by_ctrl_c() -> Iterator[None]:
    """Ctrl-C (or SIGTERM), whenever it comes, stops the runner as asked: everything it
    started is stopped on the way out (the ``with`` blocks inside), and it exits 0 without a
    traceback. From the first signal on, further ones are ignored: the stop runs to its end."""
    try:
        yield
    except KeyboardInterrupt:
        print("stopped", flush=True)


def _interrupt(signum: int, frame: object) -> None:
    _ignore_interrupts()  # one stop at a time: the ``finally`` blocks run undisturbed
    raise KeyboardInterrupt


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    main()
