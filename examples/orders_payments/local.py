"""Both services on this machine with no external services: an embedded PostgreSQL (one
database per service), the embedded Tansu broker (``--broker kafka``: Apache Kafka from the
jars in ~/.cache/outboxkit), and each app under uvicorn. Ctrl-C stops everything.

    python -m examples.orders_payments.local
    curl -s localhost:8001/orders -H 'content-type: application/json' \\
         -d '{"customer_id": "c-1", "lines": [{"sku": "tea", "quantity": 2, "unit_price": "3.25"}]}'
    curl -s localhost:8001/orders/<order_id>      # "status": "paid" a moment later
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outboxkit.embedded import EmbeddedPostgres, EmbeddedTansu, KafkaCluster

TOPICS = ["shop.orders", "shop.payments", "shop.orders.dlq", "shop.payments.dlq"]
REPO = Path(__file__).resolve().parents[2]
KAFKA_JARS = Path.home() / ".cache" / "outboxkit" / "kafka-4.4.0"


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


async def create_topics(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 3, 1) for t in TOPICS])
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=["tansu", "kafka"], default="tansu")
    parser.add_argument("--orders-port", type=int, default=8001)
    parser.add_argument("--payments-port", type=int, default=8002)
    args = parser.parse_args()
    with EmbeddedPostgres() as pg, broker(args.broker) as (bootstrap, broker_env):
        for db in ("orders", "payments"):
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {db}")
        asyncio.run(create_topics(bootstrap))
        apps = []
        for name, port in (("orders", args.orders_port), ("payments", args.payments_port)):
            env = {
                **os.environ,
                **broker_env,
                "OUTBOXKIT_DATABASE_URL": pg.url(name),
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "PYTHONPATH": str(REPO),
            }
            apps.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "uvicorn",
                        "--factory",
                        "--port",
                        str(port),
                        f"examples.orders_payments.{name}:create_app",
                    ],
                    env=env,
                )
            )
        print(f"orders on :{args.orders_port}, payments on :{args.payments_port} — Ctrl-C stops")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            for app in apps:
                app.terminate()
            for app in apps:
                app.wait(30)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    main()
