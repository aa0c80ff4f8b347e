"""Both MongoDB services on this machine with no external services: an embedded mongod (a
single-node replica set; one database per service), the embedded Tansu broker (``--broker
kafka``: Apache Kafka from the jars in ~/.cache/outboxkit), and each app under uvicorn. Ctrl-C
stops everything, the apps first.

    python -m examples.orders_payments_mongodb.local

mongod is MongoDB Community Server, licensed under the SSPL and not part of outboxkit: it is
fetched into ~/.cache/outboxkit on first use (docs/mongodb.md). The same ``curl`` commands as
for ``examples.orders_payments.local`` work.
"""

from __future__ import annotations

from examples.orders_payments.local import SERVICES, arguments, serve, stopped_by_ctrl_c
from outboxkit.embedded import EmbeddedMongo
from outboxkit.embedded.mongodb import MONGOD_VERSION, mongod_cache_dir


def main() -> None:
    args = arguments(__doc__)
    print(f"mongod {MONGOD_VERSION} (SSPL, not part of outboxkit) from {mongod_cache_dir()}")
    with stopped_by_ctrl_c(), EmbeddedMongo(fetch=True) as mongo:
        # MongoDB creates a database on its first write: a name in the URL is all it takes.
        serve("examples.orders_payments_mongodb", {db: mongo.url(db) for db in SERVICES}, args)


if __name__ == "__main__":
    main()
