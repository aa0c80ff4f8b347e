"""Options shared by the ``outboxkit`` commands.

Options that say where things are or how a worker runs have an ``OUTBOXKIT_*`` environment
variable twin (shown in ``--help``); per-invocation flags (``--json``, ``--sql``, ``--limit``,
``--all``, the ``topics create`` and ``dev`` flags) have none: :data:`PER_INVOCATION` lists
them, and a test checks that every other option has its twin.
"""

from __future__ import annotations

from typing import Annotated

import typer

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        envvar="OUTBOXKIT_DATABASE_URL", metavar="URL", help="postgresql://… or mongodb://…"
    ),
]
BootstrapServers = Annotated[
    str | None,
    typer.Option(
        envvar="OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS",
        metavar="HOST:PORT,…",
        help="Kafka brokers to bootstrap from.",
    ),
]
Topics = Annotated[
    str | None,
    typer.Option(envvar="OUTBOXKIT_TOPICS", metavar="TOPIC,…", help="Topics, comma-separated."),
]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
Limit = Annotated[int, typer.Option(metavar="N", help="At most this many rows.")]
DlqSuffix = Annotated[
    str,
    typer.Option(
        envvar="OUTBOXKIT_DLQ_SUFFIX",
        metavar="SUFFIX",
        help="Dead-letter topic of a topic: <topic><suffix>.",
    ),
]

LogFormatOption = Annotated[
    str,
    typer.Option(envvar="OUTBOXKIT_LOG_FORMAT", metavar="console|json", help="Log format."),
]
LogLevelOption = Annotated[
    str,
    typer.Option(
        envvar="OUTBOXKIT_LOG_LEVEL",
        metavar="debug|info|warning|error",
        help="Log level; debug also shows the traceback of a failure.",
    ),
]
HttpPort = Annotated[
    int | None,
    typer.Option(
        envvar="OUTBOXKIT_HTTP_PORT",
        metavar="PORT",
        help="Serve /healthz and /metrics (Prometheus) on this port.",
    ),
]

#: Flags that only shape one run of a command: no environment variable twin, on purpose.
PER_INVOCATION = frozenset(
    {
        "help",
        "version",
        "debug",
        "json_output",
        "sql",
        "check_only",
        "limit",
        "replay_all",
        "replayed",
        "prune",
        "again",
        "to",
        "partitions",
        "replication_factor",
        "config",
        "dlq",
        "broker",
        "event_ids",
        "target",
        "topic_names",
        "principal",
        "name",
        "no_transactions",
        "relay_acls",
        "inbox_acls",
    }
)
