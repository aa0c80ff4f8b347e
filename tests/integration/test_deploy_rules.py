"""The alert rules (``deploy/prometheus/outboxkit-rules.yaml``) under promtool: they load and
lint clean (``promtool check rules``), and every alert fires on its synthetic series and stays
silent on its look-alike (``promtool test rules``, both test files). A rule made
blind (a threshold raised out of reach) fails those tests, so they do test something.

promtool is built from the Go module proxy on first use (:mod:`tests.gotools`; ``.ci/run``
builds it first): the timeout allows that build, which an empty module cache makes long."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests import deploy
from tests.gotools import BUILD_TIMEOUT

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 60)


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_rules_load_and_lint_clean(promtool: Path) -> None:
    result = _promtool(
        promtool, "check", "rules", "--lint=all", "--lint-fatal", deploy.RULES.name,
        cwd=deploy.RULES.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in deploy.rules()["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout, result.stdout


def test_each_alert_fires_on_its_series_and_not_on_its_look_alike(promtool: Path) -> None:
    files = [path.name for path in deploy.RULES_TESTS]
    result = _promtool(promtool, "test", "rules", *files, cwd=deploy.RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


def test_a_blind_rule_fails_its_tests(promtool: Path, tmp_path: Path) -> None:
    rules = deploy.RULES.read_text()
    blind = "expr: outboxkit:relay_oldest_pending_age_seconds:max > 300000"
    (tmp_path / deploy.RULES.name).write_text(
        rules.replace("expr: outboxkit:relay_oldest_pending_age_seconds:max > 300", blind)
    )
    [minutes, _] = deploy.RULES_TESTS
    shutil.copy(minutes, tmp_path)
    result = _promtool(promtool, "test", "rules", minutes.name, cwd=tmp_path)
    assert result.returncode != 0, result.stdout
    assert "OutboxkitRelayPartitionStuck" in result.stdout + result.stderr
