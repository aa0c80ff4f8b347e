"""The relay benchmark, one module per phase over one harness (run it as ``bench/relay.py``).

- ``harness``: context, results, CPU accounting, Kafka helpers, the relays' metrics;
- ``outbox``: the one seam to a database (:class:`~bench.relay_bench.outbox.BenchOutbox`), and
  its PostgreSQL implementation; ``outbox_mongodb``: its MongoDB one (``--database mongodb``);
- ``relays``: relay processes (or in-process Relay objects), killed and restarted at will;
- ``consumer``: paced writers and a ``read_committed`` consumer for commit → consumer timing;
- ``phase_*``: ceiling, drain, steady, idle, churn, writer, claims.
"""
