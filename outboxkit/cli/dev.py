"""``outboxkit dev …``: PostgreSQL and Kafka on this machine (:mod:`outboxkit.dev`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from outboxkit.cli_options import JsonOutput
from outboxkit.dev import Broker, default_dir, down, status, up

dev_app = typer.Typer(
    help="PostgreSQL and Kafka on this machine for development: "
    'eval "$(outboxkit dev up)", then outboxkit dev down.',
    no_args_is_help=True,
)

DevDir = Annotated[
    Path | None,
    typer.Option(
        envvar="OUTBOXKIT_DEV_DIR",
        metavar="DIR",
        help="Where the servers keep their data and state [default: ~/.cache/outboxkit/dev].",
        show_default=False,
    ),
]


@dev_app.command("up")
def dev_up(
    broker: Annotated[
        str,
        typer.Option(
            metavar="kafka|tansu",
            help="kafka: Apache Kafka (Java 17; its jars are fetched once with Maven). "
            "tansu: a Kafka-protocol broker that needs no Java, but has no transactions.",
        ),
    ] = "kafka",
    directory: DevDir = None,
) -> None:
    """Start an embedded PostgreSQL and an embedded Kafka broker in the background (or find
    them running) and print the `export OUTBOXKIT_…` lines that reach them:
    eval "$(outboxkit dev up)". They run until `outboxkit dev down`."""
    if broker not in ("kafka", "tansu"):
        raise typer.BadParameter("kafka or tansu", param_hint="--broker")
    chosen: Broker = "kafka" if broker == "kafka" else "tansu"
    where = directory or default_dir()
    if status(where) is None:
        typer.echo(f"# starting PostgreSQL and {chosen} in the background ({where})…", err=True)
    env = up(where, chosen)
    typer.echo(env.exports(), nl=False)
    typer.echo(f"# running (pid {env.pid}); stop them with: outboxkit dev down", err=True)
    typer.echo(f"# {TRUSTS_EVERY_LOGIN}", err=True)


#: Said at every ``dev up``: a wrong password that works here fails on a real server.
TRUSTS_EVERY_LOGIN = (
    "this PostgreSQL trusts every local login (any user, any password): a wrong password in "
    "OUTBOXKIT_DATABASE_URL goes unnoticed here, not on your servers"
)


@dev_app.command("down")
def dev_down(directory: DevDir = None) -> None:
    """Stop the servers of `outboxkit dev up` and delete their data."""
    if down(directory or default_dir()):
        typer.echo("stopped the development servers", err=True)
    else:
        typer.echo("no development servers were running", err=True)


@dev_app.command("env")
def dev_env(directory: DevDir = None, json_output: JsonOutput = False) -> None:
    """Print the `export OUTBOXKIT_…` lines of the running servers (exit 1 if none run)."""
    env = status(directory or default_dir())
    if env is None:
        typer.echo("error: no development servers run: outboxkit dev up", err=True)
        raise typer.Exit(1)
    if json_output:
        import json  # noqa: PLC0415

        typer.echo(json.dumps(env.env, indent=2))
    else:
        typer.echo(env.exports(), nl=False)


@dev_app.command("jars")
def dev_jars() -> None:
    """Fetch Apache Kafka's jars once with Maven (for `dev up`, `demo --broker kafka` and the
    test fixtures) and print their directory."""
    from outboxkit.embedded.kafka_jars import fetch_kafka_jars  # noqa: PLC0415

    typer.echo(str(fetch_kafka_jars()))
