"""The Spark pipeline's package: importable without pyspark, explicit API, settings, CLI."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import load_settings
from outboxkit.pipeline import PipelineSettings
from outboxkit.pipeline.cli import pipeline_app


def test_the_cli_and_the_package_do_not_import_pyspark() -> None:
    code = (
        "import sys, outboxkit.cli, outboxkit.inbox, outboxkit.pipeline; "
        "assert 'pyspark' not in sys.modules, 'pyspark was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="needs the [spark] extra")
def test_all_is_sorted_and_resolves() -> None:
    import outboxkit.pipeline as package  # noqa: PLC0415

    assert package.__all__ == sorted(package.__all__)
    for name in package.__all__:
        assert getattr(package, name) is not None, name


def test_settings_read_durations_and_triggers() -> None:
    settings = load_settings(
        PipelineSettings, pipeline_output="/lake", pipeline_trigger="30", pipeline_watermark="P1D"
    )
    assert settings.pipeline_trigger == timedelta(seconds=30)
    assert settings.pipeline_watermark == timedelta(days=1)
    assert settings.checkpoint == "/lake/_checkpoints"
    assert settings.output("quarantine") == "/lake/quarantine"
    assert load_settings(PipelineSettings, pipeline_output="/lake").available_now


@pytest.mark.parametrize(
    ("values", "variable"),
    [
        ({}, "OUTBOXKIT_PIPELINE_OUTPUT is not set"),
        ({"pipeline_trigger": "sometimes"}, "OUTBOXKIT_PIPELINE_TRIGGER"),
        ({"pipeline_watermark": "0"}, "OUTBOXKIT_PIPELINE_WATERMARK"),
        ({"database_url": "mongodb://x/db"}, "OUTBOXKIT_DATABASE_URL"),
        ({"pipeline_job": "not a job"}, "OUTBOXKIT_PIPELINE_JOB"),
    ],
)
def test_bad_settings_name_their_variable(values: dict[str, str], variable: str) -> None:
    if "PIPELINE_OUTPUT" not in variable:
        values = {"pipeline_output": "/lake", **values}
    with pytest.raises(ConfigurationError) as caught:
        load_settings(PipelineSettings, **values)
    assert variable in str(caught.value)


def test_run_needs_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOXKIT_PIPELINE_JOB", raising=False)
    result = CliRunner().invoke(pipeline_app, ["run", "--output", "/lake"])
    assert result.exit_code == 2
    assert "OUTBOXKIT_PIPELINE_JOB" in result.output


def test_the_package_never_imports_the_demo() -> None:
    from pathlib import Path  # noqa: PLC0415

    folder = Path(__file__).resolve().parents[2] / "pipeline"
    for module in folder.glob("*.py"):
        assert "outboxkit.demo" not in module.read_text().replace(
            "outboxkit.demo.pipeline:order_totals", ""
        ), module


def test_run_exits_2_on_bad_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOXKIT_PIPELINE_OUTPUT", raising=False)
    result = CliRunner().invoke(pipeline_app, ["run", "--trigger", "never"])
    assert result.exit_code == 2
    assert "OUTBOXKIT_PIPELINE_OUTPUT" in result.output
    assert "OUTBOXKIT_PIPELINE_TRIGGER" in result.output
