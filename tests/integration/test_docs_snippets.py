"""Every ```python block of README.md, docs/ and examples/ runs, against the real servers
(tests/docs_snippets.py says how): what a reader copies works."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.docs_snippets import REPO, Snippets, all_snippets
from tests.helpers import run_cli
from tests.integration.conftest import MakeTopic
from tests.timeouts import GROUP_ENV

pytestmark = [pytest.mark.timeout(180)]


@pytest.mark.parametrize(
    "snippets",
    [pytest.param(s, marks=[pytest.mark.spark] if s.spark else []) for s in all_snippets()],
    ids=lambda s: s.name,
)
async def test_the_snippets_of_a_document_run(
    snippets: Snippets, pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": pg_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        **GROUP_ENV,
    }
    if snippets.topics:
        for topic in snippets.topics:
            await make_topic(name=topic, partitions=3)
        env["OUTBOXKIT_TOPICS"] = ",".join(snippets.topics)
        synced = run_cli("topics", "sync", env=env)
        assert synced.returncode == 0, synced.stderr
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", snippets.code],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=150,
        check=False,
    )
    assert result.returncode == 0, f"{snippets.name}:\n{result.stdout}\n{result.stderr}"
