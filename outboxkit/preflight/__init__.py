"""The operator's preflight: what ``outboxkit check`` and every worker command run before they
start, and what they say when something fails. None of it runs inside a service: a process that
writes, relays or consumes never imports this package (tests/unit/test_lazy_backends.py).

- :mod:`.check`: Kafka's checks (reachable, topics there), and each database's through its
  backend (``Backend.check``, results of :mod:`outboxkit.backends.checks`);
- :mod:`.diagnose`: a failure explained in one line with the fix, and the preflight of
  ``outboxkit relay|inbox|topics``;
- :mod:`.kafka_handshake`: why a connection to Kafka failed (TLS, SASL, the wrong listener);
- :mod:`.kafka_permissions`: which ACL a worker lacks, probed with the worker's own requests;
- :mod:`.kafka_acls`: the ACLs each worker needs (``outboxkit acls``, docs/security.md).
"""
