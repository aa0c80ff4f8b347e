"""The relays under test: ``outboxkit relay`` processes (the default) or Relay objects in the
benchmark's own event loop, started, scraped, killed, restarted and diagnosed."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import os
import signal
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, cast

from prometheus_client import CollectorRegistry, generate_latest

from bench.relay_bench.harness import Ctx, group_state
from outboxkit.backends import backend_for
from outboxkit.embedded import free_port
from outboxkit.relay import Relay, RelayMetrics, RelaySettings

ENTRY = Path(__file__).resolve().parents[1] / "relay.py"


class Relays(Protocol):
    @property
    def pids(self) -> list[int]: ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def metrics_text(self) -> list[str]: ...
    def check_alive(self) -> None: ...
    async def diagnose(self) -> str: ...


def dump_tasks(loop: asyncio.AbstractEventLoop, out: Any) -> None:
    """Every task of ``loop`` with the line it waits on (for a partition that stopped moving)."""
    for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
        chain = []
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                name = Path(frame.f_code.co_filename).name
                chain.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        print(f"task {task.get_name()!r}: {' -> '.join(chain) or task}", file=out)
    out.flush()


def child_relay(argv: list[str]) -> None:
    """``python -m outboxkit relay`` plus a SIGUSR1 handler that prints every asyncio task's
    stack to the log: the benchmark uses it to show where a stuck partition waits."""

    def on_usr1(signum: int, frame: object) -> None:
        with contextlib.suppress(RuntimeError):
            dump_tasks(asyncio.get_running_loop(), sys.stderr)

    signal.signal(signal.SIGUSR1, on_usr1)
    from outboxkit.cli import main as cli_main  # noqa: PLC0415 - only in the relay process

    sys.argv = ["outboxkit", *argv]
    profile_to = os.environ.get("OUTBOXKIT_BENCH_PROFILE")
    if profile_to is None:
        cli_main()
        return
    # CPU time, not wall time: in an event loop on a busy machine, wall time charges a call
    # for every other process that ran meanwhile (a socket send then "takes" 0.3 ms).
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        cli_main()
    finally:
        profile.disable()
        profile.dump_stats(profile_to)


def relay_overrides(ctx: Ctx) -> dict[str, str]:
    """``--relay-setting max_in_flight=3000`` → {"max_in_flight": "3000"}."""
    found = {}
    for item in ctx.args.relay_setting:
        name, _, value = item.partition("=")
        found[name.strip().lower().removeprefix("outboxkit_")] = value.strip()
    return found


async def relay_env(ctx: Ctx, topic: str, group: str, **extra: str) -> dict[str, str]:
    """The relays' OUTBOXKIT_* variables: Kafka as ``ctx.security`` says (over SASL_SSL, the
    group's user and its ACLs are made here), then ``--relay-setting`` and ``extra``."""
    settings = {**relay_overrides(ctx), **extra}
    return {
        "OUTBOXKIT_DATABASE_URL": ctx.outbox.url,
        **await ctx.security.relay_environment(group, topic),
        "OUTBOXKIT_TOPICS": topic,
        "OUTBOXKIT_RELAY_NAME": group,
        **{f"OUTBOXKIT_{k.upper()}": v for k, v in settings.items()},
    }


class InProcessRelays:
    """``n`` Relay objects in this process, each with its own storage and wake-up source (what
    ``backend_for`` gives the database's URL, as the CLI does)."""

    def __init__(self, ctx: Ctx, n: int, topic: str, group: str) -> None:
        self.ctx = ctx
        self.topic = topic
        self.group = group
        self.n = n
        self.registries = [CollectorRegistry() for _ in range(n)]
        self._stack = contextlib.AsyncExitStack()
        self.relays: list[Relay] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pids(self) -> list[int]:
        return [os.getpid()]

    async def start(self) -> None:
        env = await relay_env(self.ctx, self.topic, self.group)
        fields = {k.removeprefix("OUTBOXKIT_").lower(): v for k, v in env.items()}
        settings = RelaySettings(**cast(dict[str, Any], fields))
        for registry in self.registries:
            backend = backend_for(settings.database_url)
            storage, wakeups = await self._stack.enter_async_context(backend.relay(settings))
            relay = Relay(settings, storage, wakeups, metrics=RelayMetrics(registry))
            self.relays.append(relay)
            self._tasks.append(asyncio.create_task(relay.run()))

    async def stop(self) -> None:
        for relay in self.relays:
            relay.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()

    async def metrics_text(self) -> list[str]:
        return [generate_latest(r).decode() for r in self.registries]

    def check_alive(self) -> None:
        for task in self._tasks:
            if task.done():
                task.result()
                raise RuntimeError("relay ended")

    async def diagnose(self) -> str:
        out = io.StringIO()
        for i, relay in enumerate(self.relays):
            print(f"relay {i}: {relay.health()}", file=out)
        dump_tasks(asyncio.get_running_loop(), out)
        return out.getvalue()


class SubprocessRelays:
    """``n`` relay processes configured by OUTBOXKIT_* variables: ``python -m outboxkit relay``
    run through :func:`child_relay` (the same CLI, plus a task dump on SIGUSR1). Relay ``i``
    can be killed and restarted (the churn phase); ``instance_ids`` gives each a static
    consumer-group membership (``relay-<i>``)."""

    def __init__(
        self, ctx: Ctx, n: int, topic: str, group: str, *, instance_ids: bool = False, **extra: str
    ) -> None:
        self.ctx = ctx
        self.topic = topic
        self.extra = extra
        self.env: dict[str, str] = {}
        self.n = n
        self.group = group
        self.instance_ids = instance_ids
        self.procs: list[asyncio.subprocess.Process | None] = [None] * n
        self.ports = [free_port() for _ in range(n)]
        self.logs = [ctx.workdir / f"relay-{group}-{i}.log" for i in range(n)]
        self.expected_dead: set[int] = set()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.returncode is None]

    async def start(self) -> None:
        for i in range(self.n):
            await self.start_one(i)

    async def start_one(self, i: int) -> None:
        if not self.env:
            self.env = await relay_env(self.ctx, self.topic, self.group, **self.extra)
        # Unbuffered: a SIGKILLed relay keeps its last lines.
        env = {
            **os.environ,
            **self.env,
            "OUTBOXKIT_HTTP_PORT": str(self.ports[i]),
            "PYTHONUNBUFFERED": "1",
        }
        if self.instance_ids:
            env["OUTBOXKIT_INSTANCE_ID"] = f"relay-{i}"
        argv = [sys.executable, str(ENTRY), "--child-relay", "relay"]
        profile_dir: Path | None = self.ctx.args.profile_dir
        if profile_dir is not None:
            out = profile_dir / f"relay-{self.group}-{i}-{time.monotonic_ns()}.prof"
            env["OUTBOXKIT_BENCH_PROFILE"] = str(out)
        with self.logs[i].open("ab") as f:
            self.procs[i] = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=f, stderr=asyncio.subprocess.STDOUT
            )
        self.expected_dead.discard(i)

    async def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.returncode is None:
            self.expected_dead.add(i)
            proc.kill()
            await proc.wait()

    def signal(self, i: int, signum: int) -> None:
        """Send ``signum`` to relay ``i`` if it runs (SIGSTOP/SIGCONT: the churn's faults)."""
        proc = self.procs[i]
        if proc is not None and proc.returncode is None:
            proc.send_signal(signum)

    async def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def metrics_text(self) -> list[str]:
        def get(port: int) -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body: bytes = r.read()
                    return body.decode()
            except OSError:
                return ""

        live = [p for i, p in enumerate(self.ports) if i not in self.expected_dead]
        return list(await asyncio.gather(*(asyncio.to_thread(get, p) for p in live)))

    async def health(self, i: int) -> str:
        def get() -> str:
            url = f"http://127.0.0.1:{self.ports[i]}/healthz"
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    body: bytes = r.read()
                    return body.decode()
            except OSError as exc:
                return repr(exc)

        return await asyncio.to_thread(get)

    async def diagnose(self) -> str:
        for proc in self.procs:
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1.0)
        parts = []
        for i, log in enumerate(self.logs):
            health = await self.health(i)
            text = await asyncio.to_thread(log.read_text, errors="replace")
            tail = "\n".join(text.splitlines()[-60:])
            parts.append(f"--- relay {i} /healthz: {health}\n{tail}")
        return "\n".join(parts)

    def check_alive(self) -> None:
        for i, (proc, log) in enumerate(zip(self.procs, self.logs, strict=True)):
            if proc is not None and proc.returncode is not None and i not in self.expected_dead:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"relay exited with {proc.returncode}:\n{tail}")


def make_relays(ctx: Ctx, n: int, topic: str, group: str) -> Relays:
    if ctx.args.relay_mode == "inprocess":
        return InProcessRelays(ctx, n, topic, group)
    return SubprocessRelays(ctx, n, topic, group)


@contextlib.asynccontextmanager
async def running_relays(
    ctx: Ctx, n: int, topic: str, group: str, relays: Relays | None = None
) -> AsyncIterator[Relays]:
    relays = relays or make_relays(ctx, n, topic, group)
    await relays.start()
    try:
        await wait_ready(ctx, relays, n, topic, f"outboxkit.relay.{group}")
        yield relays
    finally:
        await relays.stop()


async def wait_ready(ctx: Ctx, relays: Relays, n: int, topic: str, group_id: str) -> None:
    """Until the group is stable with ``n`` members and every partition's worker waits (idle,
    declared as such): the relays are up, producers initialised."""
    deadline = time.monotonic() + 90
    stable_since: float | None = None
    while True:
        relays.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"relays of {group_id} not ready after 90 s")
        idle = await ctx.outbox.relays_idle(topic, ctx.args.partitions)
        members, state = await group_state(ctx, group_id)
        if members == n and state == "Stable" and idle:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since > 0.5:
                return
        else:
            stable_since = None
        await asyncio.sleep(0.1)
