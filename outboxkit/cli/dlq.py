"""``outboxkit inbox dlq list`` and ``outboxkit inbox dlq replay``: the inbox's dead-letter
topics."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Annotated

import typer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.progress import Progress

from outboxkit.cli.common import EXIT_FAILED, fail_config, kafka_settings, parse_event_ids
from outboxkit.cli_options import BootstrapServers, DlqSuffix, JsonOutput, Limit, Topics
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.printable import printable
from outboxkit.core.words import counted
from outboxkit.inbox import (
    DeadLetter,
    DeadLetterError,
    read_dead_letters,
    replay_dead_letters,
    replay_targets,
    unique_dead_letters,
)

dlq_app = typer.Typer(
    help="Dead-letter topics (<topic><suffix>): list what the inbox dead-lettered, replay it.",
    no_args_is_help=True,
)


def _dlq_topics(topics: str | None, suffix: str) -> list[str]:
    names = [t.strip() for t in (topics or "").split(",") if t.strip()]
    if not names:
        raise fail_config(
            ConfigurationError("OUTBOXKIT_TOPICS is not set: give the inbox's topics (--topics)")
        )
    return [name if name.endswith(suffix) else f"{name}{suffix}" for name in names]


def _read_dlq(servers: str | None, topics: list[str], limit: int | None) -> list[DeadLetter]:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(read_dead_letters(kafka_settings(servers), topics, limit=limit))
    except DeadLetterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


@dlq_app.command("list")
def dlq_list(
    *,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    dlq_suffix: DlqSuffix = ".dlq",
    limit: Limit = 100,
    replayed: Annotated[
        bool,
        typer.Option(
            "--replayed", help="Also list the dead letters replayed already, marked as such."
        ),
    ] = False,
    json_output: JsonOutput = False,
) -> None:
    """Dead-lettered records with their reason, error and source position, oldest first; those
    replayed already (outboxkit inbox dlq replay) only with --replayed."""
    # Read whole: a replay's marker comes after the dead letter it replayed.
    every = _read_dlq(kafka_bootstrap_servers, _dlq_topics(topics, dlq_suffix), None)
    hidden = 0 if replayed else sum(1 for d in every if d.replays)
    letters = [d for d in every if replayed or not d.replays][:limit]
    if json_output:
        typer.echo(json.dumps([d.summary() for d in letters], indent=2))
        return
    if not every:
        typer.echo("no dead-lettered records")
    first = {id(d) for d in unique_dead_letters(letters)}
    for d in letters:
        info = d.summary()
        # Dead-lettering is at least once: a later copy of the same one is marked as such.
        copy = "" if id(d) in first else " (a copy of an earlier dead letter)"
        # Headers are whatever the record's producer wrote: escaped, never sent to the terminal.
        typer.echo(
            printable(
                f"{info['dlq']} {info['event_id'] or '-'} {info['event_type'] or '-'} "
                f"from {info['source']}: {info['reason']}: {info['error']}"
            )
            + copy
            + _replayed(d)
        )
    if hidden:
        typer.echo(f"{counted(hidden, 'replayed dead letter')} not shown (--replayed shows them)")


def _replayed(letter: DeadLetter) -> str:
    """`` (replayed to orders/0@12 at …)`` for a dead letter replayed already."""
    if not letter.replays:
        return ""
    last = letter.replays[-1]
    times = f", {len(letter.replays)} times" if len(letter.replays) > 1 else ""
    return printable(f" (replayed to {last.to} at {last.at:%Y-%m-%d %H:%M:%S}Z{times})")


@dlq_app.command("replay")
def dlq_replay(
    event_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="EVENT_ID", help="Event ids (UUIDs) to replay.", show_default=False),
    ] = None,
    *,
    replay_all: Annotated[
        bool, typer.Option("--all", help="Replay every dead-lettered record.")
    ] = False,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="TOPIC",
            help="Publish to this topic (partitioned by key) instead of the one each dead-letter "
            "topic belongs to.",
            show_default=False,
        ),
    ] = None,
    again: Annotated[
        bool,
        typer.Option("--again", help="Replay dead letters that were replayed already, once more."),
    ] = False,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    dlq_suffix: DlqSuffix = ".dlq",
    json_output: JsonOutput = False,
) -> None:
    """Publish dead-lettered events again (after fixing the handler, say) to the topic their
    dead-letter topic belongs to (<topic><suffix> → <topic>), at the partition they came from,
    or to --to TOPIC. A source-topic header naming another topic is shown, never obeyed. Each
    takes effect once; a replayed event comes after newer ones of its key. A dead letter
    replayed already is said so and left, unless --again."""
    if not event_ids and not replay_all:
        raise fail_config(ConfigurationError("give event ids to replay, or --all"))
    wanted = set(map(str, parse_event_ids(event_ids or [])))
    letters = _read_dlq(kafka_bootstrap_servers, _dlq_topics(topics, dlq_suffix), None)
    if not replay_all:
        letters = [d for d in letters if d.event_id in wanted]
        missing = wanted - {d.event_id for d in letters}
        if missing:
            typer.echo(
                f"error: no dead-lettered record with event id {', '.join(sorted(missing))}",
                err=True,
            )
            raise typer.Exit(EXIT_FAILED)
    letters = unique_dead_letters(letters)  # each dead-lettering once, not each copy of it
    done = [] if again else [d for d in letters if d.replays]
    letters = [d for d in letters if again or not d.replays]
    if not replay_all:
        for d in done:
            typer.echo(
                f"already replayed: {d.event_id}{_replayed(d)}; --again replays it once more",
                err=True,
            )
    try:
        targets = replay_targets(letters, dlq_suffix=dlq_suffix, to=to)
    except DeadLetterError as exc:
        typer.echo(printable(f"error: {exc}"), err=True)
        raise typer.Exit(EXIT_FAILED) from None
    for target in targets:
        if target.misdirected is not None:
            letter = target.letter
            typer.echo(
                printable(
                    f"warning: {letter.topic}/{letter.partition}@{letter.offset}: its "
                    f"outboxkit-source-topic header names {target.misdirected!r}, but "
                    f"{letter.topic} is the dead-letter topic of "
                    f"{letter.topic.removesuffix(dlq_suffix)!r}: replaying it to {target.topic!r}"
                ),
                err=True,
            )
    # On stderr, and only on a terminal: stdout keeps the result alone (a progress display
    # that is not shown still printed an empty line there).
    console = Console(stderr=True)
    with Progress(console=console, disable=json_output or not console.is_terminal) as progress:
        task = progress.add_task("replaying", total=len(letters))
        try:
            sent = asyncio.run(
                replay_dead_letters(
                    kafka_settings(kafka_bootstrap_servers),
                    letters,
                    dlq_suffix=dlq_suffix,
                    to=to,
                    on_sent=lambda _: progress.advance(task),
                    on_unmarked=_unmarked,
                )
            )
        except (DeadLetterError, KafkaError) as exc:
            typer.echo(printable(f"error: {exc}"), err=True)
            raise typer.Exit(EXIT_FAILED) from None
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "replayed": [d.summary() for d in letters],
                    "already_replayed": [d.summary() for d in done],
                },
                indent=2,
            )
        )
        return
    line = f"replayed {counted(sent, 'record')}"
    if done:
        them = "it" if len(done) == 1 else "them"
        line += f"; {len(done)} replayed already (--again replays {them} once more)"
    typer.echo(line)


def _unmarked(letter: DeadLetter, error: KafkaError) -> None:
    typer.echo(
        printable(
            f"warning: {letter.event_id} replayed, but its replay could not be noted in "
            f"{letter.topic} ({error!r}): a later replay will not know it (WRITE on the "
            "dead-letter topic is needed)"
        ),
        err=True,
    )
