"""``EmbeddedMongo``: one mongod as a single-node replica set on 127.0.0.1."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Self
from urllib.parse import quote

from outboxkit.embedded._process import ManagedServer, free_port
from outboxkit.embedded.mongodb._binary import find_mongod
from outboxkit.embedded.mongodb._mongod import Mongod, StopMode, mongod_parameters

REPLICA_SET = "rs0"


class EmbeddedMongo(ManagedServer, Mongod):
    """One mongod, a single-node replica set ``rs0``, with its data in ``data_dir`` (a new
    temporary directory by default) and on a free port of 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The server dies with this
    process, even on SIGKILL. Settings suit throwaway servers: a 0.25 GB WiredTiger cache, small
    journal files, no diagnostic data capture. ``transaction_lifetime_limit_seconds`` (mongod's
    default 60; a SIGKILLed writer's transaction then held its locks for 90 s in a test) bounds
    how long a transaction whose client died keeps its write locks;
    ``ttl_monitor_sleep_seconds`` (default 60) is how often TTL indexes are swept; ``parameters``
    are passed as more ``--setParameter name=value``. ``fetch`` downloads mongod if it is
    missing (see :func:`find_mongod`)."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        binary: Path | None = None,
        fetch: bool = False,
        transaction_lifetime_limit_seconds: int | None = None,
        ttl_monitor_sleep_seconds: int | None = None,
        parameters: Mapping[str, str] | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        super().__init__(
            Path(data_dir or tempfile.mkdtemp(prefix="outboxkit-mongo-")),
            port=port or free_port(),
            binary=binary or find_mongod(fetch=fetch),
            replica_set=REPLICA_SET,
            parameters=mongod_parameters(
                transaction_lifetime_limit_seconds, ttl_monitor_sleep_seconds, parameters
            ),
        )

    def url(self, database: str = "") -> str:
        """``mongodb://127.0.0.1:<port>/<database>?replicaSet=rs0``: the driver discovers the
        set and, across a restart, waits for the primary instead of failing at once."""
        return f"mongodb://{self.address}/{quote(database)}?replicaSet={REPLICA_SET}"

    def start(self, *, timeout: float = 60.0) -> Self:
        """Start mongod (initiating the replica set the first time) and wait for a primary."""
        if self.running:
            return self
        fresh = self.fresh
        self.spawn(timeout=timeout)
        client = self.client()
        try:
            if fresh:
                # The set's config lives in the data (the ``local`` database): only a new data
                # directory is initiated; a restart elects its only member again by itself.
                client.admin.command(
                    "replSetInitiate",
                    {"_id": REPLICA_SET, "members": [{"_id": 0, "host": self.address}]},
                )
            self.wait(
                lambda hello: (hello or {}).get("isWritablePrimary"),
                timeout=timeout,
                what="to become primary",
                client=client,
            )
        except BaseException:
            self.stop("immediate")
            raise
        finally:
            client.close()
        return self

    def restart(self, mode: StopMode = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Kill the server and delete its directory if this object made it."""
        self.stop("immediate")
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
