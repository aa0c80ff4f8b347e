"""The example services started the way their README starts them (``python -m
examples.orders_payments.local``, ``…_mongodb.local``): on their own embedded database and
broker, each app under uvicorn. Once the runner prints its banner, the very first order is taken
(201, not a refused connection nor a 500 for an unregistered topic) and paid, and the services
log nothing at debug level by default, nor the runner's readiness polls. Then Ctrl-C in its
terminal (SIGINT to its whole process group) stops it all within seconds, the apps before their
database and broker, without an error or a warning, and it exits 0. The consoles the banner
names need the token it prints."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outboxkit.embedded._process import free_port
from tests.docs_snippets import REPO
from tests.helpers import http_client, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

#: Seconds Ctrl-C may take to stop the runner, its apps and its servers.
STOPS_WITHIN = 5.0

ORDER = {"customer_id": "c-1", "lines": [{"sku": "tea", "quantity": 2, "unit_price": "3.25"}]}


@contextlib.contextmanager
def runner(package: str, log: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m <package>.local`` on free ports, its output in ``log``, in a session of its
    own (as a terminal's foreground job: a process group the test can signal whole); the
    orders service's URL. Killed with its group afterwards if it still runs."""
    orders, payments = free_port(), free_port()
    ports = ["--orders-port", str(orders), "--payments-port", str(payments)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-u", "-m", f"{package}.local", *ports],
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            yield process, f"http://127.0.0.1:{orders}"
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def ctrl_c(process: subprocess.Popen[str]) -> tuple[int, float]:
    """What a terminal's Ctrl-C does: SIGINT to the foreground process group. The runner's
    exit code, and how long it took to exit."""
    started = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    try:
        code = process.wait(60)
    except subprocess.TimeoutExpired:
        code = -1
    return code, time.monotonic() - started


@pytest.mark.parametrize(
    "package",
    [
        pytest.param("examples.orders_payments", id="postgresql"),
        pytest.param("examples.orders_payments_mongodb", id="mongodb", marks=pytest.mark.mongodb),
    ],
)
async def test_the_first_order_after_the_banner_is_taken_and_paid(package: str) -> None:
    """Catches a runner that announces its services before they can take a write: a refused
    connection (uvicorn not listening yet) or a 500 (the writer's topic not registered until
    the relay joined its group), both seen on 4bac9f4; and debug logs at the default level.
    Then catches a Ctrl-C that reached the embedded database along with the apps: it stopped
    first, each app logged dozens of connection warnings and "background task failed while
    stopping" errors, and stops took up to 11 s (or 30 s, then a traceback and exit 1)."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        runner(package, Path(tmp) / "out.log") as (
            process,
            url,
        ),
    ):
        log = Path(tmp) / "out.log"

        def banner() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            return "payments on :" in log.read_text()

        await wait_for(banner, within=100, interval=0.05, what="the runner's banner")
        async with http_client(base_url=url, timeout=30) as client:
            placed = await client.post("/orders", json=ORDER)  # at once, no retry
            assert placed.status_code == 201, placed.text + log.read_text()[-3000:]
            order_id = placed.json()["order_id"]

            async def paid() -> bool:
                order = (await client.get(f"/orders/{order_id}")).json()
                return bool(order["status"] == "paid")

            await wait_for(paid, within=60, interval=0.2, what="the first order paid")
            # The console the banner names answers its token, and nobody without it.
            token = re.search(r"\(token (\S+)\)", log.read_text())
            assert token is not None, log.read_text()[-3000:]
            bearer = {"authorization": f"Bearer {token[1]}"}
            assert (await client.get("/outboxkit/", headers=bearer)).status_code == 200
            assert (await client.get("/outboxkit/")).status_code in (303, 401)
        code, took = ctrl_c(process)
        output = log.read_text()
    assert code == 0, output[-3000:]
    assert took < STOPS_WITHIN, f"stopped in {took:.1f} s\n{output[-3000:]}"
    complaints = ("[warning", "[error", "ERROR:", "Traceback")
    assert [line for line in output.splitlines() if any(c in line for c in complaints)] == []
    assert output.count("Application shutdown complete") == 2, output[-3000:]
    assert "[debug" not in output, [line for line in output.splitlines() if "[debug" in line]
    # #44: the runner's readiness polls filled the log with ~48 "503 Service Unavailable".
    assert "GET /healthz" not in output, output[-3000:]
    assert "POST /orders" in output  # the access log itself is on
    assert "Traceback" not in output, output[-3000:]
