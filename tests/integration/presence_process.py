"""A relay process as far as presence goes, for the presence tests: it announces a member,
says so, and then either waits to die or, with ``beat_every``, announces again at that pace (as
a relay does at each check) until it is frozen or killed."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from outboxkit.embedded._process import die_with_parent

_SCRIPT = """
import asyncio, sys
from outboxkit.relay import MongoOutboxStorage, PostgresOutboxStorage

async def main(url, group, member, app_name, beat_every):
    if url.startswith("mongodb"):
        storage = MongoOutboxStorage(url, app_name=app_name)
    else:
        storage = PostgresOutboxStorage(url, application_name=app_name)
    async with storage:
        await storage.announce_member(group, member)
        print("announced", flush=True)
        if not float(beat_every):
            await asyncio.Event().wait()  # until killed
        while True:
            await asyncio.sleep(float(beat_every))
            await storage.announce_member(group, member)

asyncio.run(main(*sys.argv[1:]))
"""


@contextlib.contextmanager
def announcing_process(
    url: str, group: str, member: str, *, app_name: str = "announcer", beat_every: float = 0.0
) -> Iterator[subprocess.Popen[str]]:
    """A process that announced ``member`` of ``group``; the test may SIGSTOP or SIGKILL it
    (it is killed at the end)."""
    with subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, url, group, member, app_name, str(beat_every)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no leftovers if pytest dies
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "announced"
            yield process
        finally:
            process.kill()
