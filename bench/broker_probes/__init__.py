"""What a Kafka-protocol broker supports, as aiokafka sees it: one module per family of probes
over one harness (run it as ``bench/broker_features.py``).

- ``harness``: the run's context and result rows, topic, producer and consumer helpers;
- ``produce``: negotiated protocol versions, acks=all, null keys and values, headers,
  the idempotent producer;
- ``transactions``: commit/abort, isolation levels, fencing, abandoned transactions;
- ``groups``: joins, rebalances, killed and paused members, not polling, KIP-848;
- ``partitioner``: murmur2 against the Java client;
- ``children``: members and producers in processes of their own (SIGSTOP, SIGKILL);
- ``main``: the probes' registry, the runner and the Markdown table.
"""
