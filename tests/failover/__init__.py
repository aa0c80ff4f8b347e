"""A failover harness: a steady load through 3 relays and 2 inbox workers while a test (or
``bench/failover.py``) breaks a server, then what Kafka and the database hold afterwards is
checked against G1, G2, G4 and G6, and each fault's unavailability is measured.

It knows nothing of the fault: a scenario is any code run inside ``run.fault(name)``. It takes
a database URL (PostgreSQL or MongoDB) and a Kafka bootstrap, so the same run serves broker
faults (``tests/integration/test_failover_kafka.py``) and database faults.

- :mod:`.harness` — :class:`~tests.failover.harness.FailoverRun`: topics, writers, processes,
  faults, and the final checks;
- :mod:`.arrivals` — a ``read_committed`` consumer that notes when each event reached Kafka;
- :mod:`.publishers` — G4 from the topic itself: which producer (id and epoch) wrote each
  committed record;
- :mod:`.report` — gaps per fault and the guarantees' outcome, printed in one table.
"""
