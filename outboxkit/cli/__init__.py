"""The ``outboxkit`` command.

Exit codes: 0 success; 1 a check or operation failed; 2 invalid configuration or usage.
Options that say where things are or how a worker runs have an ``OUTBOXKIT_*`` environment
variable twin, shown in ``--help``; per-invocation flags (``--json``, ``--limit``…) do not
(:mod:`outboxkit.cli_options`). Expected failures end the command with one or two lines on
stderr (:mod:`outboxkit.preflight.diagnose`); ``--debug`` or ``OUTBOXKIT_LOG_LEVEL=debug`` shows the
traceback too.

One module per command group: :mod:`~outboxkit.cli.migrate` (``check``, ``migrate``),
:mod:`~outboxkit.cli.relay`, :mod:`~outboxkit.cli.inbox` (with :mod:`~outboxkit.cli.dlq`),
:mod:`~outboxkit.cli.outbox`, :mod:`~outboxkit.cli.topics`, :mod:`~outboxkit.cli.schemas`
(``schemas export``, ``schemas check``: the CI gate on event changes), :mod:`~outboxkit.cli.dev`;
``demo`` and ``pipeline`` live with their packages (:mod:`outboxkit.demo.cli`,
:mod:`outboxkit.pipeline.cli`). What they share is in :mod:`~outboxkit.cli.common`.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated

import typer
from typer._click.exceptions import ClickException  # typer's own click
from typer.core import TyperArgument

from outboxkit._version import __version__
from outboxkit.cli import common
from outboxkit.cli.acls import acls_app
from outboxkit.cli.common import EXIT_FAILED
from outboxkit.cli.console import console_command
from outboxkit.cli.dev import dev_app
from outboxkit.cli.inbox import inbox_app
from outboxkit.cli.migrate import check, migrate_command
from outboxkit.cli.outbox import outbox_app
from outboxkit.cli.relay import relay_app
from outboxkit.cli.schemas import schemas_app
from outboxkit.cli.topics import topics_app
from outboxkit.demo.cli import demo
from outboxkit.pipeline.cli import pipeline_app
from outboxkit.preflight.diagnose import explain
from outboxkit.variables import unknown_variable_warnings

__all__ = ["app", "main"]


def _argument_usage(self: TyperArgument) -> str:
    """An argument in the usage line as a Unix command shows it: ``MODULE:INBOX``, or
    ``[EVENT_ID]...`` when it may be left out (typer put a required one in braces, which read
    as part of its name: ``{MODULE[:REGISTRY]}``)."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


def _argument_type(self: TyperArgument, ctx: typer.Context) -> str | None:
    """No ``<str>`` after an argument's metavar, which already says what to give (as options
    show none after theirs)."""
    return None if self.metavar else TyperArgument.display_type(self, ctx)


# typer has no setting for either: its argument class, as this command uses it.
TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
TyperArgument.display_type_rich = _argument_type  # type: ignore[method-assign,assignment]

app = typer.Typer(
    name="outboxkit",
    help="Transactional outbox and inbox: write to your database and publish to Kafka, safely.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help text: wrapped to the terminal, no boxes, no <bool> after flags.
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"outboxkit {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show the traceback of the exception behind a failure (as "
            "OUTBOXKIT_LOG_LEVEL=debug does; for check, of each failed check that raised one), "
            "and debug logs.",
        ),
    ] = False,
) -> None:
    """Transactional outbox and inbox: write to your database and publish to Kafka, safely."""
    common.debug = common.debug or debug


# The order of `outboxkit --help`: commands (check, migrate, demo), then groups.
app.command("check")(check)
app.command("migrate")(migrate_command)
app.add_typer(relay_app, name="relay")
app.add_typer(inbox_app, name="inbox")
app.command("demo")(demo)
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(outbox_app, name="outbox")
app.add_typer(topics_app, name="topics")
app.add_typer(acls_app, name="acls")
app.add_typer(schemas_app, name="schemas")
app.command("console")(console_command)
app.add_typer(dev_app, name="dev")


def main(argv: Sequence[str] | None = None) -> None:
    """The ``outboxkit`` command: expected failures end it with one or two lines on stderr and
    a non-zero exit code; ``--debug`` (anywhere) or ``OUTBOXKIT_LOG_LEVEL=debug`` adds the
    traceback of the exception behind them (same lines, same exit code)."""
    args = list(sys.argv[1:] if argv is None else argv)
    common.debug = os.environ.get("OUTBOXKIT_LOG_LEVEL", "").strip().lower() == "debug"
    if "--debug" in args[: args.index("--") if "--" in args else len(args)]:
        args.remove("--debug")
        args.insert(0, "--debug")  # an option of the root command, wherever it was typed
    # A typo'd variable would otherwise leave its setting at the default without a word.
    for line in unknown_variable_warnings():
        typer.echo(f"warning: {line}", err=True)
    try:
        app(args=_inbox_runs_by_default(args))
    except SystemExit as exit_:
        if common.debug and exit_.code not in (0, None):
            _print_handled_exception(exit_)
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if common.debug:  # then the same lines and exit code as without
            traceback.print_exception(exc, file=sys.stderr)
        problems = explain(exc)
        if problems is None:  # not expected: a bug, worth its traceback in a report
            typer.echo(f"error: unexpected {type(exc).__name__}: {exc}", err=True)
            if not common.debug:
                typer.echo("  → Run again with --debug for the traceback, and report it.", err=True)
            sys.exit(EXIT_FAILED)
        for problem in problems:
            for line in problem.lines():
                typer.echo(line, err=True)
        sys.exit(max(p.exit_code for p in problems))


def _print_handled_exception(exit_: SystemExit) -> None:
    """With ``--debug``, the traceback of the exception a command turned into its one or two
    lines and exit code (``except …: typer.echo(…); raise typer.Exit(1) from None``): Python
    keeps it as the exit's context, however the command suppressed it."""
    seen: BaseException | None = exit_
    while seen is not None and isinstance(seen, SystemExit | typer.Exit):
        seen = seen.__context__
    if seen is not None and not isinstance(seen, ClickException | typer.Abort):
        traceback.print_exception(seen, file=sys.stderr)


def _inbox_runs_by_default(args: list[str]) -> list[str]:
    """``outboxkit inbox module:obj`` means ``outboxkit inbox run module:obj``."""
    at = 1 if args[:1] == ["--debug"] else 0
    if (
        len(args) >= at + 2
        and args[at] == "inbox"
        and args[at + 1] not in {"run", "dlq", "status", "--help"}
    ):
        return [*args[:at], "inbox", "run", *args[at + 1 :]]
    return args
