"""``EmbeddedMongoReplicaSet``: three mongod as one replica set on 127.0.0.1, whose primary a
test can step down, kill and restart, as production's sets fail over."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from outboxkit.embedded._process import ManagedServer, ServerStartError, free_port
from outboxkit.embedded.mongodb._binary import find_mongod
from outboxkit.embedded.mongodb._mongod import Hello, Mongod, StopMode, mongod_parameters

#: The members' priorities: member 0 is the primary whenever it is up and caught up (it takes
#: over again after a restart), member 1 is the one a failover of member 0 elects, then member 2.
PRIORITIES = (3, 2, 1)


def _is_primary(hello: Hello | None) -> bool:
    return bool((hello or {}).get("isWritablePrimary"))


def _is_member(hello: Hello | None) -> bool:
    """PRIMARY or SECONDARY: a member that serves its set (not starting, not recovering)."""
    return _is_primary(hello) or bool((hello or {}).get("secondary"))


class ReplicaSetMember(Mongod):
    """One member of an :class:`EmbeddedMongoReplicaSet`: :meth:`stop` (SIGTERM), :meth:`kill`
    (SIGKILL) and :meth:`start` again on the same port and data, where it rejoins its set."""

    def __init__(self, index: int, priority: int, base_dir: Path, **options: Any) -> None:
        super().__init__(base_dir, **options)
        self.index = index
        self.priority = priority

    def __repr__(self) -> str:
        return f"<member {self.index} {self.address} priority {self.priority}>"

    def start(self, *, timeout: float = 60.0, rejoin: bool = True) -> Self:
        """Start mongod; with ``rejoin``, wait until it is a primary or secondary again."""
        if not self.running:
            self.spawn(timeout=timeout)
        if rejoin:
            self.wait(_is_member, timeout=timeout, what="to rejoin its replica set")
        return self

    def restart(self, mode: StopMode = "fast", *, timeout: float = 60.0) -> None:
        self.stop(mode)
        self.start(timeout=timeout)

    @property
    def is_primary(self) -> bool:
        return _is_primary(self.hello())


class EmbeddedMongoReplicaSet(ManagedServer):
    """Three mongod from one binary (:func:`find_mongod`), each with its own port and data
    directory under ``data_dir`` (a new temporary directory by default), as replica set
    ``name``, with :data:`PRIORITIES` so that a failover elects a known member.

    ``election_timeout_ms`` and ``heartbeat_interval_ms`` go to the set's settings
    (``electionTimeoutMillis``, ``heartbeatIntervalMillis``; mongod's defaults are 10 000 and
    2 000): tests shorten them so that a killed primary is replaced in a few seconds. The other
    options are :class:`~outboxkit.embedded.mongodb.EmbeddedMongo`'s, for every member.

    A member stopped with SIGTERM (``fast``) waits mongod's quiesce period before it exits, 15 s
    by default (``shutdownTimeoutMillisForSignaledShutdown``, a ``parameters`` entry), while it
    tells clients it is shutting down; tests shorten it too.

    Use as a context manager, or :meth:`start` and :meth:`close`. :meth:`start` returns once
    member 0 is a writable primary and the others are secondaries, so ``majority`` writes
    succeed. Every member dies with this process, even on SIGKILL."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        name: str = "rs0",
        binary: Path | None = None,
        fetch: bool = False,
        election_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        transaction_lifetime_limit_seconds: int | None = None,
        ttl_monitor_sleep_seconds: int | None = None,
        parameters: Mapping[str, str] | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.base_dir = Path(data_dir or tempfile.mkdtemp(prefix="outboxkit-mongo-rs-"))
        self.name = name
        self.election_timeout_ms = election_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        binary = binary or find_mongod(fetch=fetch)
        chosen = mongod_parameters(
            transaction_lifetime_limit_seconds, ttl_monitor_sleep_seconds, parameters
        )
        self.members = [
            ReplicaSetMember(
                index,
                priority,
                self.base_dir / f"member{index}",
                port=free_port(),
                binary=binary,
                replica_set=name,
                parameters=chosen,
            )
            for index, priority in enumerate(PRIORITIES)
        ]

    def url(self, database: str = "") -> str:
        """``mongodb://<member>,<member>,<member>/<database>?replicaSet=<name>``: every member,
        so that a client finds the set whichever members are up."""
        hosts = ",".join(member.address for member in self.members)
        return f"mongodb://{hosts}/{quote(database)}?replicaSet={self.name}"

    def config(self) -> dict[str, Any]:
        """The ``replSetInitiate`` document: members with their priorities, and the settings."""
        settings: dict[str, int] = {}
        if self.election_timeout_ms is not None:
            settings["electionTimeoutMillis"] = self.election_timeout_ms
        if self.heartbeat_interval_ms is not None:
            settings["heartbeatIntervalMillis"] = self.heartbeat_interval_ms
        members = [
            {"_id": m.index, "host": m.address, "priority": m.priority} for m in self.members
        ]
        return {"_id": self.name, "members": members, "settings": settings}

    def start(self, *, timeout: float = 120.0) -> Self:
        """Start every member (initiating the set the first time) and wait until member 0 is
        primary and the others secondaries."""
        fresh = self.members[0].fresh
        try:
            for member in self.members:
                member.start(timeout=timeout, rejoin=False)
            first = self.members[0]
            if fresh:
                with first.client() as client:
                    client.admin.command("replSetInitiate", self.config())
            first.wait(_is_primary, timeout=timeout, what="to become primary")
            for member in self.members[1:]:
                member.start(timeout=timeout)
        except BaseException:
            for member in self.members:
                member.kill()
            raise
        return self

    def primary(self, *, timeout: float = 60.0) -> ReplicaSetMember:
        """The member that is the writable primary now, waiting up to ``timeout`` for one (an
        election in progress)."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self.members:
                if member.is_primary:
                    return member
            if time.monotonic() > deadline:
                states = {m.index: self._state(m) for m in self.members}
                raise ServerStartError(f"replica set {self.name}: no primary, members {states}")
            time.sleep(0.05)

    def secondaries(self) -> list[ReplicaSetMember]:
        """The running members that are secondaries now."""
        return [m for m in self.members if (m.hello() or {}).get("secondary")]

    def step_down(
        self, seconds: int = 10, *, catch_up_seconds: int = 5, timeout: float = 60.0
    ) -> tuple[ReplicaSetMember, ReplicaSetMember]:
        """``replSetStepDown`` on the primary: it stops taking writes, waits up to
        ``catch_up_seconds`` for a secondary to catch up, hands over (an election at once, not
        after ``electionTimeoutMillis``), and cannot be elected again for ``seconds`` (mongod's
        defaults are 60 and 10; shorter here, so that a test can fail the next primary over
        back to it). Returns (the member that stepped down, the new primary). The hand-over
        picks any caught-up secondary; a higher-priority one takes over from it a few seconds
        later (:meth:`wait_for_primary`)."""
        from pymongo.errors import PyMongoError  # noqa: PLC0415 - loaded by old.client() already

        old = self.primary(timeout=timeout)
        with old.client() as client:
            try:
                client.admin.command(
                    "replSetStepDown", seconds, secondaryCatchUpPeriodSecs=catch_up_seconds
                )
            except PyMongoError as exc:
                if _is_primary(old.hello()):
                    raise ServerStartError(f"{old!r} did not step down: {exc}") from exc
        return old, self.primary(timeout=timeout)

    def wait_for_primary(self, member: ReplicaSetMember, *, timeout: float = 60.0) -> None:
        """Wait until ``member`` is the primary (e.g. the one the priorities choose, once an
        election and any priority takeover are over)."""
        member.wait(_is_primary, timeout=timeout, what="to become primary")

    def rolling_restart(
        self, mode: StopMode = "fast", *, timeout: float = 120.0
    ) -> list[ReplicaSetMember]:
        """Restart every member in turn, as an upgrade does: each secondary (stopped with
        ``mode``, started, rejoined), then the primary after it stepped down. Returns the
        members in the order they were restarted. Member 0, the highest priority, takes the
        primary back once it has caught up (mongod's priority takeover): one more election."""
        primary = self.primary(timeout=timeout)
        order = [m for m in reversed(self.members) if m is not primary]
        for member in order:
            member.restart(mode, timeout=timeout)
        self.step_down(timeout=timeout)
        primary.restart(mode, timeout=timeout)
        return [*order, primary]

    def wait_for_members(self, *, timeout: float = 60.0) -> None:
        """Wait until every member is up and a primary or secondary (after restarts)."""
        for member in self.members:
            member.start(timeout=timeout)

    def states(self) -> dict[int, str]:
        """Each member's state now: PRIMARY, SECONDARY, DOWN, or what ``hello`` says."""
        return {m.index: self._state(m) for m in self.members}

    @staticmethod
    def _state(member: ReplicaSetMember) -> str:
        hello = member.hello()
        if hello is None:
            return "DOWN"
        if _is_primary(hello):
            return "PRIMARY"
        if hello.get("secondary"):
            return "SECONDARY"
        return "OTHER"

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop every member: the secondaries first, so the primary needs no election."""
        for member in sorted(self.members, key=lambda m: m.is_primary):
            member.stop(mode)

    def close(self) -> None:
        """Kill every member and delete the directory if this object made it."""
        for member in self.members:
            member.kill()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
