"""``outboxkit console``: the web console on its own (outboxkit.console), read from
``OUTBOXKIT_*`` like every worker."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from outboxkit.cli.common import configure_worker_logging, fail_config, load, run_on_loop
from outboxkit.cli_options import (
    BootstrapServers,
    DatabaseUrl,
    LogFormatOption,
    LogLevelOption,
    Topics,
)
from outboxkit.core.exceptions import ConfigurationError


def console_command(
    *,
    host: Annotated[
        str,
        typer.Option(
            envvar="OUTBOXKIT_CONSOLE_HOST",
            metavar="HOST",
            help="Address to listen on. The default answers this machine only; with another, "
            "set OUTBOXKIT_CONSOLE_TOKEN and serve it over HTTPS (a proxy in front).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(envvar="OUTBOXKIT_CONSOLE_PORT", metavar="PORT", help="Port to listen on."),
    ] = 8600,
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    log_format: LogFormatOption = "console",
    log_level: LogLevelOption = "info",
) -> None:
    """Serve the web console: the outbox's partitions and their owners, the inboxes' lag, parked
    records and dead letters (retry, skip, replay with OUTBOXKIT_CONSOLE_ACTIONS and a token),
    the event registry. Its settings: docs/configuration.md, "Console"."""
    missing = [m for m in ("fastapi", "jinja2", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise fail_config(
            ConfigurationError(
                f"the console needs {', '.join(missing)}: pip install 'outboxkit[console]'"
            )
        )
    import uvicorn  # noqa: PLC0415 - the [console] extra

    from outboxkit.console import ConsoleSettings, console  # noqa: PLC0415 - the same

    configure_worker_logging(log_format, log_level)
    settings = load(
        ConsoleSettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
    )
    try:
        app = console(settings=settings)
    except ConfigurationError as exc:
        raise fail_config(exc) from None
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, server_header=False
    )
    typer.echo(f"outboxkit console on http://{host}:{port}/", err=True)
    run_on_loop(_server(uvicorn, config).serve(), "asyncio")


def _server(uvicorn: Any, config: Any) -> Any:
    """uvicorn's server, stopping on SIGTERM/SIGINT with exit code 0 as the workers do (uvicorn
    raises the signal again once it has stopped, for the process to die of it)."""

    class Server(uvicorn.Server):  # type: ignore[misc]
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return Server(config)
