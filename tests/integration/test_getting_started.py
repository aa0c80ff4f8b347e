"""docs/getting-started.md, literally: its shell and python blocks run as written and in order,
in one shell, in an empty directory, with no hidden setup (tests/docs_snippets.py says how the
blocks become a script). From `pip install` of the wheel RELEASING.md builds (the session's
``built`` fixture) into a new virtualenv, through `outboxkit dev up`, migrate, topics, a FastAPI
writer, a handler, the relay and the inbox, to a charged order and a dead-lettered one, and
`outboxkit dev down`."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from outboxkit.dev import status
from outboxkit.embedded import free_port
from outboxkit.embedded.kafka_jars import default_jars_dir
from tests.docs_snippets import REPO, blocks, literal_script
from tests.integration.conftest import Built

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

DOC = REPO / "docs" / "getting-started.md"


def test_the_document_has_no_hidden_snippets_and_only_runnable_blocks() -> None:
    text = DOC.read_text()
    assert "<!--" not in text, "no hidden setup: everything the reader needs is on the page"
    languages = {b.language for b in blocks(DOC) if not b.illustrative}  # output is
    assert languages <= {"sh", "python"}, languages
    assert [b.saved_as for b in blocks(DOC) if b.saved_as] == [
        "shop_events.py",
        "shop_api.py",
        "shop_inbox.py",
    ]


def test_getting_started_runs_as_written(built: Built, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip(
            "the guide places orders with curl, which is not installed: apt-get install curl"
        )
    work = tmp_path / "project"
    work.mkdir()
    dev_dir = tmp_path / "dev"
    # The reader's clone, ~/outboxkit, with the wheel `python -m build` put in its dist/.
    home = tmp_path / "home"
    (home / "outboxkit" / "dist").mkdir(parents=True)
    shutil.copy(built.wheel, home / "outboxkit" / "dist")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OUTBOXKIT_") and k not in {"VIRTUAL_ENV", "PYTHONPATH"}
        },
        "HOME": str(home),
        # `python3` is this environment's interpreter (3.11), which makes the guide's virtualenv;
        # everything after `. .venv/bin/activate` is that virtualenv's.
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        # What the moved HOME would lose: Kafka's jars and pip's cache (not the install).
        "OUTBOXKIT_KAFKA_JARS": str(default_jars_dir()),
        "PIP_CACHE_DIR": str(Path.home() / ".cache" / "pip"),
        # The servers' state in this test's directory; a free port for the app.
        "OUTBOXKIT_DEV_DIR": str(dev_dir),
        "PORT": str(free_port()),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    script = literal_script(DOC)
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=360)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        running = status(dev_dir)
        if running is not None:  # the document's last step did not run: stop them here
            subprocess.run([sys.executable, "-m", "outboxkit", "dev", "down"], env=env, check=False)
    logs = "".join(
        f"\n--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(work.glob("*.log"))
    )
    assert process.returncode == 0, f"{output}{logs}"
    installed = [line for line in output.splitlines() if line.startswith("Successfully installed")]
    assert installed, output
    assert f"outboxkit-{built.wheel.name.split('-')[1]}" in installed[0].split()
    assert (work / ".venv" / "bin" / "outboxkit").exists(), "the guide's virtualenv has it"
    # dev up's PostgreSQL lets any password in, which would hide a wrong one: it says so.
    assert "this PostgreSQL trusts every local login (any user, any password)" in output
    assert "created orders: 3 partitions" in output
    assert "created orders.dlq: 3 partitions" in output
    assert "charged: [('o-" in output
    # What the reader sees is what they need (#28): no curl error while the app starts (curl
    # --retry printed four), each response on a line of its own.
    assert "curl: (" not in output, output
    assert re.search(r'^\{"order_id":"o-[0-9a-f]{8}"\}$', output, re.MULTILINE), output
    assert "handler_failed" in output
    assert "above the card limit" in output
    assert status(dev_dir) is None, "outboxkit dev down stopped the servers"
