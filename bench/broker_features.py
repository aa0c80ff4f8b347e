"""Measure what a Kafka-protocol broker supports, as seen by aiokafka (the probes:
``bench/broker_probes/``).

Run against a live broker; every probe creates its own uniquely named topics and is bounded
in time, and the run prints one table row per fact::

    python bench/broker_features.py --bootstrap 127.0.0.1:29092 --label kafka-4.4.0
    python bench/broker_features.py --bootstrap 127.0.0.1:39092 --label tansu-0.6

``--only fencing_zombie,group_classic`` runs a subset, ``--list`` names the probes.
Some probes run a second copy of this script as a child process (``--child ...``) so that
a member or producer can be frozen (SIGSTOP) or killed (SIGKILL) like a real process.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker_probes.main import main

if __name__ == "__main__":
    sys.exit(main())
