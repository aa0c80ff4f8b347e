"""A rolling upgrade from release N-1 to this one, as docs/upgrading.md describes it, on
PostgreSQL and on MongoDB: N-1 (tests/previous_release.py: the last ``v*`` tag, or the commit
before the newest migration; its wheel in a virtualenv of its own) migrates the database and
runs 2 relays and an inbox worker, with writers of both releases writing all along; then this
release's ``outboxkit migrate --check`` and ``migrate`` run beside them, an N-1 relay restarts
on the migrated schema, two relays of this release join the group of N-1 ones, the N-1 relays
stop (SIGTERM), and an inbox worker of this release replaces the N-1 one. G1, G2, G4 and G6
are checked on everything read back (tests/failover's harness), and each step's delivery gap
is bounded.

The relays of N-1 and N share one group here because their assignor protocol is the same
(``relay/assignor.py``); a release that changes it cannot pass this test as it is: its relays
wait refused until the old ones have stopped (docs/upgrading.md, "Relays")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from uuid import UUID

import pytest

from outboxkit.core.kafka import admin_client
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.embedded._process import die_with_parent, free_port
from outboxkit.relay.ownership import describe_group
from tests.failover.harness import FailoverRun, Worker
from tests.helpers import started_worker, wait_for
from tests.integration.inbox_harness import INBOX_ENV, InboxProcess
from tests.integration.relay_harness import RelayProcess
from tests.previous_release import Release, build_release
from tests.timeouts import RELAY_ENV

#: Longest commit→Kafka or Kafka→effect delay a step may cause (a rebalance and its fencing,
#: on this noisy 2-core machine).
MAX_GAP = 30.0

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(300)]

#: The writers of N-1: its own harness's Writers (on entities of their own, so that each
#: entity's events stay in series), until a stop file appears; then what they committed. Its
#: ``_write`` took the pace as an interval until v0.1.0, which reads it from ``rate``.
OLD_WRITERS = """
import asyncio, inspect, json, pathlib, sys
from tests.integration.inbox_app import Payment
from tests.helpers import wait_for
from tests.integration.relay_harness import Writers

async def main(url, topic, rate, stop, out):
    writers = Writers(url, topic, kind=Payment)
    names = [f"n-1-entity-{i}" for i in range(6)]
    if "interval" in inspect.signature(writers._write).parameters:
        paced = [(names[w::2], 0.0, 2 / rate) for w in range(2)]
    else:
        writers.rate, writers._writers = rate, 2
        paced = [(names[w::2], 0.0) for w in range(2)]
    tasks = [asyncio.create_task(writers._write(*args)) for args in paced]
    stopped = pathlib.Path(stop).exists
    await wait_for(stopped, within=600, interval=0.1, what="the stop file")  # or end by itself
    await writers.stop()
    await asyncio.gather(*tasks)
    pathlib.Path(out).write_text(json.dumps({
        "committed": {e: [str(i) for i in ids] for e, ids in writers.committed.items()},
        "seq_of": {str(i): s for i, s in writers.seq_of.items()},
        "committed_at": {str(i): t for i, t in writers.committed_at.items()},
    }))

asyncio.run(main(*sys.argv[1:3], float(sys.argv[3]), *sys.argv[4:6]))
"""


class OldProcess:
    """A process of release N-1: its interpreter, its ``tests`` package, started outside the
    repository (``python -m`` would put the current tree's ``outboxkit`` first)."""

    def __init__(self, release: Release, log_dir: Path, env: dict[str, str], *args: str) -> None:
        self.log_path = log_dir / f"n-1-{args[0]}-{uuid.uuid4().hex[:6]}.log"
        self._env = {**os.environ, **env, **release.env()}
        self._args = [str(release.python), *args]
        self._cwd = log_dir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> OldProcess:
        with self.log_path.open("ab") as log:
            self.process = started_worker(
                subprocess.Popen(
                    self._args,
                    env=self._env,
                    cwd=self._cwd,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 - no leftovers if pytest dies
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 60) -> int:
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class UpgradeRun(FailoverRun):
    """The failover harness whose first workers are release N-1's."""

    release: Release | None = None

    def _spawn(
        self, name: str, kind: type[RelayProcess] | type[InboxProcess], env: dict[str, str]
    ) -> None:
        if self.release is None:
            super()._spawn(name, kind, env)
            return
        port = free_port()
        env = {**env, "OUTBOXKIT_HTTP_PORT": str(port)}
        if kind is RelayProcess:
            process = OldProcess(
                self.release, self.log_dir, {**RELAY_ENV, **env}, "-m", "outboxkit", "relay"
            )
        else:
            env = {**INBOX_ENV, **env}
            process = OldProcess(
                self.release,
                self.log_dir,
                env,
                "-m",
                "outboxkit",
                "inbox",
                "tests.integration.inbox_app:inbox",
            )
        self.workers.append(Worker(f"n-1-{name}", process.start(), port))  # type: ignore[arg-type]

    async def stop_worker(self, worker: Worker) -> None:
        """SIGTERM, a clean exit, and out of the final health check."""
        code = await asyncio.to_thread(worker.process.terminate, 90)
        assert code == 0, f"{worker.name} exited {code}: {worker.process.log_path}"
        self.workers.remove(worker)


def _cli(
    python: Path | str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "outboxkit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
        timeout=120,
    )


async def _members(run: FailoverRun) -> int:
    """Members of the relays' group (0 while it rebalances)."""
    settings = KafkaConnectionSettings(kafka_bootstrap_servers=run.bootstrap.split(","))
    async with admin_client(settings) as admin:
        state, members = await describe_group(admin, run.relay_group)
    return len(members) if state == "Stable" else 0


def _merge_old_writers(run: FailoverRun, path: Path) -> int:
    written = json.loads(path.read_text())
    for entity, ids in written["committed"].items():
        run.writers.committed[entity].extend(UUID(i) for i in ids)
    for event_id, (entity, seq) in written["seq_of"].items():
        run.writers.seq_of[UUID(event_id)] = (entity, seq)
    for event_id, at in written["committed_at"].items():
        run.writers.committed_at[UUID(event_id)] = at
    return len(written["committed_at"])


async def _upgrade(url: str, kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: PLR0915 - one story
    release = await asyncio.to_thread(build_release)
    print(f"\nrelease N-1: {release.label}")
    migrated = await asyncio.to_thread(
        _cli, release.python, "migrate", "--database-url", url, env=release.env(), cwd=tmp_path
    )
    assert migrated.returncode == 0, migrated.stderr

    stop, written = tmp_path / "stop-writers", tmp_path / "old-writers.json"
    run = UpgradeRun(
        url,
        kafka_bootstrap,
        tmp_path,
        partitions=4,
        relays=2,
        inboxes=1,
        rate=40.0,
        recovery_timeout=60.0,
    )
    run.release = release
    async with run, contextlib.AsyncExitStack() as cleanup:
        with (tmp_path / "n-1-writers.log").open("ab") as log:
            old_writers = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [
                    str(release.python),
                    "-c",
                    OLD_WRITERS,
                    url,
                    run.topic,
                    "20",
                    str(stop),
                    str(written),
                ],
                env={**os.environ, **release.env()},
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - no leftovers if pytest dies
            )
        cleanup.callback(old_writers.kill)  # a no-op once it has exited
        old_relays = [w for w in run.workers if "relay" in w.name]
        old_inbox = next(w for w in run.workers if "inbox" in w.name)
        run.release = None  # from here on, this release's workers

        async with run.fault("migrate beside N-1") as fault:
            check = await asyncio.to_thread(
                _cli, sys.executable, "migrate", "--check", "--database-url", url
            )
            assert check.returncode == 0, check.stdout + check.stderr
            assert "running relays: " in check.stdout, check.stdout
            assert "running relays: none" not in check.stdout, check.stdout
            applied = await asyncio.to_thread(
                _cli, sys.executable, "migrate", "--database-url", url
            )
            assert applied.returncode == 0, applied.stderr
            fault.detail = (
                f"{applied.stdout.strip()}; --check said: {check.stdout.splitlines()[-2]}"
            )

        async with run.fault("N-1 relay restarts on the migrated schema") as fault:
            run.release = release
            run._spawn("relay-restarted", RelayProcess, run.relay_env)
            run.release = None
            restarted = run.workers[-1]
            if await asyncio.to_thread(_reads_runs_beside, release):
                await wait_for(
                    lambda: _members_are(run, 3), within=60, interval=0.5, what="3 relays"
                )
                await wait_for(restarted.healthy, within=30, interval=0.5, what="it healthy")
                fault.detail = "starts beside the expand migration it does not know"
                old_relays.append(restarted)
            else:  # a release before the runs_beside records (docs/upgrading.md)
                code = await asyncio.to_thread(restarted.process.process.wait, 60)  # type: ignore[union-attr]
                assert code == 1, code
                assert "does not know" in restarted.process.log()
                fault.detail = "refuses to start: the migration is unknown to it"
                run.workers.remove(restarted)

        async with run.fault("N relays join the N-1 group") as fault:
            for i in range(2):
                run._spawn(f"relay-new-{i}", RelayProcess, run.relay_env)
            await wait_for(
                lambda: _members_are(run, 5), within=60, interval=0.5, what="5 relays in the group"
            )
            fault.detail = "3 of N-1, 2 of N in one group"

        async with run.fault("N-1 relays stop") as fault:
            for worker in old_relays:
                await run.stop_worker(worker)
            await wait_for(
                lambda: _members_are(run, 2), within=60, interval=0.5, what="2 relays in the group"
            )
            fault.detail = "SIGTERM, one after the other"

        async with run.fault("inbox N replaces N-1") as fault:
            run._spawn("inbox-new", InboxProcess, _inbox_env(run))
            await wait_for(
                run.workers[-1].healthy, within=60, interval=0.5, what="the new inbox healthy"
            )
            await run.stop_worker(old_inbox)
            fault.detail = "started, then SIGTERM to the old one"

        stop.touch()
        await asyncio.to_thread(old_writers.wait, 60)
        old_count = _merge_old_writers(run, written)
        assert old_count > 0, "the writers of N-1 wrote nothing"
        report = await run.finish()
    print(f"{report}\nN-1 writers: {old_count} events")
    report.assert_ok(max_gap=MAX_GAP)


def _reads_runs_beside(release: Release) -> bool:
    """Whether N-1 starts beside migrations it does not know (when they allow it)."""
    probe = (
        "import inspect, outboxkit.migrations as m; "
        "print('runs_beside' in inspect.signature(m.not_applied).parameters)"
    )
    found = subprocess.run(
        [str(release.python), "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **release.env()},
        cwd=release.run_dir,
    )
    return found.stdout.strip() == "True"


async def _members_are(run: FailoverRun, count: int) -> bool:
    try:
        return await _members(run) == count
    except Exception:  # the coordinator is moving; ask again
        return False


def _inbox_env(run: FailoverRun) -> dict[str, str]:
    from tests.integration.inbox_harness import inbox_env  # noqa: PLC0415

    return inbox_env(run.url, run.bootstrap, run.topic)


async def test_rolling_upgrade_on_postgres(
    empty_pg_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    await _upgrade(empty_pg_url, kafka_bootstrap, tmp_path)


@pytest.mark.mongodb
async def test_rolling_upgrade_on_mongodb(
    mongo_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    await _upgrade(mongo_url, kafka_bootstrap, tmp_path)
