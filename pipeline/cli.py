"""``outboxkit pipeline``: run a pipeline job locally, or fetch its jars.

pyspark is imported only inside the commands, so ``outboxkit`` works without the ``[spark]``
extra. Under ``spark-submit`` the same command runs through ``outboxkit/pipeline/__main__.py``.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Annotated, Any

import typer

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import load_settings
from outboxkit.pipeline.exceptions import PipelineError
from outboxkit.pipeline.settings import PipelineSettings
from outboxkit.pipeline.stopping import stop_on_signals

EXIT_FAILED = 1
EXIT_CONFIG = 2

pipeline_app = typer.Typer(
    help="Run the Spark pipeline over the outbox topics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # As the outboxkit command's (also under spark-submit, where this is the whole command).
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


def _option(env: str, metavar: str, help_text: str, default: str | None = None) -> Any:
    """An option as every ``outboxkit`` command has it: a metavar saying what to give (never
    ``<str>``), its environment twin and its default in ``--help``. An option whose setting has
    a plain default takes it as its own default (:func:`_default`); ``default`` describes what
    applies otherwise (the settings work it out)."""
    return typer.Option(
        envvar=f"OUTBOXKIT_{env}",
        metavar=metavar,
        help=help_text,
        show_default=default if default is not None else True,
    )


def _default(field: str) -> str:
    """The default of PipelineSettings' ``field``, as its variable would give it."""
    value = PipelineSettings.model_fields[field].default
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _fail(code: int, message: object) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@pipeline_app.command("run")
def run(
    *,
    job: Annotated[
        str | None,
        _option(
            "PIPELINE_JOB",
            "MODULE:NAME",
            "Your Pipeline, or a function of the settings that returns one (the demo's: "
            "outboxkit.demo.pipeline:order_totals).",
        ),
    ] = None,
    output: Annotated[
        str | None,
        _option("PIPELINE_OUTPUT", "DIR|URI", "Lake root: quarantine/ and your Delta tables."),
    ] = None,
    checkpoint: Annotated[
        str | None,
        _option(
            "PIPELINE_CHECKPOINT", "DIR|URI", "Checkpoint root.", default="<output>/_checkpoints"
        ),
    ] = None,
    trigger: Annotated[
        str,
        _option(
            "PIPELINE_TRIGGER",
            "available-now|SECONDS",
            "available-now (the backlog, then stop), or an interval in seconds (streaming).",
        ),
    ] = _default("pipeline_trigger"),
    watermark: Annotated[
        str,
        _option("PIPELINE_WATERMARK", "SECONDS", "Allowed lateness, seconds or ISO 8601."),
    ] = _default("pipeline_watermark"),
    name: Annotated[str, _option("PIPELINE_NAME", "NAME", "Pipeline (query) name.")] = _default(
        "pipeline_name"
    ),
    database_url: Annotated[
        str | None, _option("DATABASE_URL", "URL", "postgresql://… of the PostgreSQL sinks.")
    ] = None,
    kafka_bootstrap_servers: Annotated[
        str,
        _option("KAFKA_BOOTSTRAP_SERVERS", "HOST:PORT,…", "Kafka brokers to bootstrap from."),
    ] = _default("kafka_bootstrap_servers"),
    topics: Annotated[
        str | None,
        _option("TOPICS", "TOPIC,…", "Topics to read.", default="the models' topics"),
    ] = None,
    max_offsets_per_trigger: Annotated[
        int | None,
        _option(
            "PIPELINE_MAX_OFFSETS_PER_TRIGGER", "N", "Records per micro-batch.", default="no limit"
        ),
    ] = None,
    master: Annotated[str, _option("SPARK_MASTER", "MASTER", "Spark master.")] = _default(
        "spark_master"
    ),
    spark_jars: Annotated[
        str | None,
        _option(
            "SPARK_JARS",
            "DIR",
            "Directory of every jar (Kafka connector, Delta).",
            default="fetched with Maven into ~/.cache/outboxkit",
        ),
    ] = None,
) -> None:
    """Run a pipeline job. available-now stops when the backlog is done; an interval runs
    until SIGTERM/SIGINT."""
    try:
        settings = load_settings(
            PipelineSettings,
            pipeline_job=job,
            pipeline_output=output,
            pipeline_checkpoint=checkpoint,
            pipeline_trigger=trigger,
            pipeline_watermark=watermark,
            pipeline_name=name,
            database_url=database_url,
            kafka_bootstrap_servers=kafka_bootstrap_servers,
            topics=topics,
            pipeline_max_offsets_per_trigger=max_offsets_per_trigger,
            spark_master=master,
            spark_jars=spark_jars,
        )
    except ConfigurationError as exc:
        raise _fail(EXIT_CONFIG, exc) from None
    if settings.pipeline_job is None:
        raise _fail(
            EXIT_CONFIG,
            "OUTBOXKIT_PIPELINE_JOB is not set: give --job module:name "
            "(e.g. outboxkit.demo.pipeline:order_totals)",
        )
    try:
        from outboxkit.pipeline.job import run as run_pipeline  # noqa: PLC0415 (needs pyspark)
    except ImportError as exc:
        raise _fail(
            EXIT_CONFIG, f"{exc}: the pipeline needs pip install 'outboxkit[spark]'"
        ) from None
    from outboxkit.core.logs import configure_logging  # noqa: PLC0415

    configure_logging()
    try:
        pipeline = load_job(settings.pipeline_job, settings)
    except PipelineError as exc:
        raise _fail(EXIT_CONFIG, exc) from None
    stop = stop_on_signals(settings.pipeline_stop_grace.total_seconds())
    try:
        report = run_pipeline(pipeline, settings, stop=stop)
    except PipelineError as exc:
        raise _fail(EXIT_FAILED, exc) from None
    typer.echo(
        f"{report.name}: {report.batches} batches, {report.input_rows} records, "
        f"{report.late_rows} late rows dropped"
    )


def load_job(target: str, settings: PipelineSettings) -> Any:
    """The :class:`~outboxkit.pipeline.Pipeline` named by ``module:name``: the object itself,
    or what calling it with ``settings`` returns."""
    from outboxkit.pipeline.job import Pipeline  # noqa: PLC0415

    module_name, _, attr = target.partition(":")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PipelineError(f"OUTBOXKIT_PIPELINE_JOB={target}: {exc}") from None
    if not isinstance(value, Pipeline) and callable(value):
        value = value(settings)
    if not isinstance(value, Pipeline):
        raise PipelineError(f"OUTBOXKIT_PIPELINE_JOB={target} is not a Pipeline")
    return value


@pipeline_app.command("jars")
def jars(
    connector_version: Annotated[
        str | None,
        _option(
            "SPARK_CONNECTOR_VERSION",
            "VERSION",
            "Kafka connector version.",
            default="the installed pyspark's",
        ),
    ] = None,
) -> None:
    """Fetch the Kafka connector's and Delta Lake's jars with Maven (once) and print their
    directories."""
    from outboxkit.pipeline.jars import fetch_connector, fetch_delta  # noqa: PLC0415

    try:
        typer.echo(str(fetch_connector(version=connector_version)))
        typer.echo(str(fetch_delta()))
    except PipelineError as exc:
        raise _fail(EXIT_FAILED, exc) from None


def main() -> None:
    """Entry point of ``python -m outboxkit.pipeline`` and of ``spark-submit``."""
    pipeline_app(prog_name="outboxkit pipeline")
