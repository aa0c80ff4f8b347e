"""The unit tier passes whatever ``OUTBOXKIT_*`` variables the caller exported (#44:
``eval "$(outboxkit dev up)"`` and then ``pytest tests/unit`` failed
test_extra_options_reach_only_the_clients_that_take_them)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.docs_snippets import REPO
from tests.unit.conftest import KEPT

#: What `outboxkit dev up` exports, and more a developer's shell may hold.
EXPORTED = {
    "OUTBOXKIT_DATABASE_URL": "postgresql://outboxkit@127.0.0.1:1/outboxkit",
    "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "OUTBOXKIT_TRANSACTIONAL": "false",
    "OUTBOXKIT_DLQ_IDEMPOTENCE": "false",
    "OUTBOXKIT_TOPICS": "orders",
    "OUTBOXKIT_KAFKA_CLIENT_OPTIONS": '{"linger_ms": 50}',
    "OUTBOXKIT_LOG_LEVEL": "debug",
}


def test_no_outboxkit_variable_reaches_a_unit_test() -> None:
    assert not [n for n in os.environ if n.startswith("OUTBOXKIT_") and n not in KEPT]


def test_unit_tests_pass_with_a_dev_environment_exported() -> None:
    """The modules that build settings and clients, in a pytest of their own with the
    variables exported."""
    modules = ["test_kafka_clients.py", "test_service.py"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n0",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *(f"tests/unit/{module}" for module in modules),
        ],
        cwd=REPO,
        env={**os.environ, **EXPORTED},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
