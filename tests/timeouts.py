"""Every protocol timeout, interval and backoff the tests shorten, in one place.

The product's defaults suit production (a 10 s Kafka session, 30 s sweeps); a test that waited
on them would spend the suite's time waiting. Each value here is the shortest that keeps the
tests meaningful on a loaded 2-core machine (two pytest-xdist workers share it):

- a dead or frozen relay or inbox worker leaves its group after :data:`SESSION_TIMEOUT`,
  heartbeating every :data:`HEARTBEAT_INTERVAL` (a third of it at most, as Kafka requires);
- a relay sweeps for missed notifications every :data:`SWEEP_INTERVAL`, gives a revoked
  partition :data:`REVOKE_TIMEOUT` to drain and a Kafka transaction :data:`TRANSACTION_TIMEOUT`,
  and discards a producer whose publish has not been acknowledged after :data:`PUBLISH_TIMEOUT`;
- retries back off to :data:`RETRY_BACKOFF_MAX` at most.

The servers' own are set where they start: Kafka test brokers (``group.initial.rebalance.delay.ms
=0``, a 3 s broker session: :mod:`outboxkit.embedded.kafka`), three-member replica sets (a 2 s
election timeout: ``FAST_FAILOVER`` in tests/integration/conftest.py), test mongods (a 2 s
transaction lifetime where a test kills a client mid-transaction, a 10 s one where a link goes
half-open under one: :data:`ORPHANED_TRANSACTION_LIFETIME`).
"""

from __future__ import annotations

SESSION_TIMEOUT = 3.0
HEARTBEAT_INTERVAL = 0.5
SWEEP_INTERVAL = 1.0
REVOKE_TIMEOUT = 5.0
TRANSACTION_TIMEOUT = 5.0
#: Three transaction timeouts, as the product's defaults (30 s, 10 s). It does not shorten the one
#: stall it was first set for: aiokafka's transactional producer, in about one of twenty runs of
#: the Kafka failover test, sends nothing for ~30 s after a broker is killed (a produce task that
#: neither fails nor times out), and the relay's discard waits for that task to end: 15 s of
#: publish, then the close, were 30.3 s in all (tests/failover/report.py prints it).
PUBLISH_TIMEOUT = 15.0
RETRY_BACKOFF_MAX = 0.5
METRICS_INTERVAL = 1.0

#: OUTBOXKIT_DATABASE_TIMEOUT of a worker behind a half-open database link
#: (test_network_faults.py): how long a read waits on a silent socket before the connection is
#: given up. Above any statement of the loaded test servers.
DATABASE_TIMEOUT = 3.0
#: OUTBOXKIT_STEP_ASIDE_AFTER of a relay behind a half-open database link: it leaves its group
#: once it has read nothing for this long.
STEP_ASIDE_AFTER = 3.0
#: The same bound, and the connect timeout, of the stores test_database_timeouts.py opens itself
#: (one quick read each).
STORE_READ_TIMEOUT = 1.0
STORE_CONNECT_TIMEOUT = 1.0

#: mongod's transactionLifetimeLimitSeconds where a worker's database link goes half-open
#: (test_network_faults.py): a transaction it had open lives on until then, and its successor
#: waits on its dedupe records' locks. Long enough for the inbox's transactions on a loaded
#: machine (it keeps each to a quarter of the limit).
ORPHANED_TRANSACTION_LIFETIME = 10

#: Group membership, as ``OUTBOXKIT_*`` variables: what every relay and inbox process takes.
GROUP_ENV = {
    "OUTBOXKIT_SESSION_TIMEOUT": f"{SESSION_TIMEOUT:g}",
    "OUTBOXKIT_HEARTBEAT_INTERVAL": f"{HEARTBEAT_INTERVAL:g}",
}

#: A relay process's environment: a dead or frozen relay is replaced within ~3 s.
RELAY_ENV = {
    **GROUP_ENV,
    "OUTBOXKIT_SWEEP_INTERVAL": f"{SWEEP_INTERVAL:g}",
    "OUTBOXKIT_REVOKE_TIMEOUT": f"{REVOKE_TIMEOUT:g}",
    "OUTBOXKIT_TRANSACTION_TIMEOUT": f"{TRANSACTION_TIMEOUT:g}",
    "OUTBOXKIT_PUBLISH_TIMEOUT": f"{PUBLISH_TIMEOUT:g}",
    "OUTBOXKIT_RETRY_BACKOFF_MAX": f"{RETRY_BACKOFF_MAX:g}",
    "OUTBOXKIT_METRICS_INTERVAL": f"{METRICS_INTERVAL:g}",
}

#: An inbox process's environment.
INBOX_ENV = {**GROUP_ENV, "OUTBOXKIT_RETRY_BACKOFF_MAX": f"{RETRY_BACKOFF_MAX:g}"}

#: The same for ``Outboxkit(...)`` and the settings objects, by field name.
SERVICE_SETTINGS = {
    "session_timeout": SESSION_TIMEOUT,
    "heartbeat_interval": HEARTBEAT_INTERVAL,
    "retry_backoff_max": RETRY_BACKOFF_MAX,
}
