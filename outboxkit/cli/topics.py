"""``outboxkit topics create``, ``outboxkit topics describe`` and ``outboxkit topics sync``.

outboxkit's workers never create topics (a typo must fail, not create a topic): ``topics
create`` does, once, on purpose. It is idempotent — existing topics are left as they are and
reported — and creates each topic's dead-letter topic ``<topic><suffix>`` too, which an inbox needs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from typing import Annotated, NoReturn

import typer
from aiokafka.errors import KafkaError

from outboxkit.backends import sync_topics
from outboxkit.cli.common import EXIT_FAILED, fail_config, load
from outboxkit.cli_options import BootstrapServers, DatabaseUrl, DlqSuffix, JsonOutput, Topics
from outboxkit.core.exceptions import ConfigurationError, TopicsNotDescribedError
from outboxkit.core.kafka import (
    TopicSpec,
    TopicState,
    admin_client,
    create_command,
    describe_topics,
    ensure_topics,
)
from outboxkit.core.settings import ConnectionSettings, KafkaSettings, load_settings
from outboxkit.core.words import counted
from outboxkit.preflight.diagnose import preflight
from outboxkit.preflight.kafka_permissions import principal
from outboxkit.relay import StorageUnavailableError

topics_app = typer.Typer(
    help="Kafka topics: create them (with their dead-letter topics), describe them, record "
    "their partition counts for writers.",
    no_args_is_help=True,
)

TopicNames = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="TOPIC",
        help="Topics (default: OUTBOXKIT_TOPICS).",
        show_default=False,
    ),
]


def _kafka_settings(
    servers: str | None, topics: str | None, names: list[str] | None
) -> KafkaSettings:
    settings = load_settings(
        KafkaSettings,
        kafka_bootstrap_servers=servers,
        topics=",".join(names) if names else topics,
    )
    if not settings.topics:
        raise ConfigurationError(
            "no topics given: name them (outboxkit topics create orders) or set OUTBOXKIT_TOPICS"
        )
    # Failures are reported as one line each; aiokafka would also log every retry.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    return settings


def _configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"--config {pair!r}: give KEY=VALUE, e.g. retention.ms=86400000"
            )
        configs[key.strip()] = value.strip()
    return configs


def _describe_state(state: TopicState) -> str:
    parts = [
        counted(state.partitions, "partition"),
        f"replication factor {state.replication_factor}",
    ]
    parts += [f"{key}={value}" for key, value in sorted(state.configs.items())]
    if state.under_replicated:
        parts.append(f"{state.under_replicated} partition(s) under-replicated")
    return ", ".join(parts)


@topics_app.command("create")
def create(
    topic_names: TopicNames = None,
    *,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    partitions: Annotated[
        int, typer.Option(min=1, metavar="N", help="Partitions of each new topic.")
    ] = 6,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="Replicas of each partition [default: 3, or the number of brokers if fewer].",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="A topic config, e.g. retention.ms=604800000 (repeat for more). With 3 "
            "replicas or more, min.insync.replicas defaults to 2.",
            show_default=False,
        ),
    ] = None,
    dlq: Annotated[
        bool,
        typer.Option(
            "--dlq/--no-dlq", help="Also create each topic's dead-letter topic <topic><suffix>."
        ),
    ] = True,
    dlq_suffix: DlqSuffix = ".dlq",
    json_output: JsonOutput = False,
) -> None:
    """Create topics (and their dead-letter topics) that do not exist yet. Safe to run again:
    existing topics are reported and left as they are."""
    settings = _kafka_settings(kafka_bootstrap_servers, topics, topic_names)
    names = list(settings.topics)
    if dlq:
        names += [f"{t}{dlq_suffix}" for t in settings.topics if not t.endswith(dlq_suffix)]
    configs = _configs(config or [])
    specs = [
        TopicSpec(name, partitions, replication_factor, configs) for name in dict.fromkeys(names)
    ]
    try:
        states = asyncio.run(
            ensure_topics(settings, specs, request_timeout=settings.connect_timeout)
        )
    except TopicsNotDescribedError as exc:
        if exc.created:
            typer.echo(f"created {', '.join(exc.created)} (Kafka will not show them: see below)")
        _refused_describe(settings, exc)
    if json_output:
        typer.echo(json.dumps([asdict(s) for s in states], indent=2))
        return
    for state in states:
        verb = "created" if state.created else "exists "
        typer.echo(
            f"{verb} {state.name}: {counted(state.partitions, 'partition')}, "
            f"replication factor {state.replication_factor}"
        )


def _refused_describe(settings: KafkaSettings, exc: TopicsNotDescribedError) -> NoReturn:
    names = ", ".join(f"Topic:{topic}" for topic in exc.topics)
    typer.echo(f"error: Kafka does not allow {principal(settings)} DESCRIBE on {names}", err=True)
    typer.echo(
        "  → Grant DESCRIBE on them (READ, WRITE and ALTER imply it, CREATE does not; "
        "docs/security.md lists the ACLs each worker needs).",
        err=True,
    )
    raise typer.Exit(EXIT_FAILED)


@topics_app.command("describe")
def describe(
    topic_names: TopicNames = None,
    *,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    dlq_suffix: DlqSuffix = ".dlq",
    json_output: JsonOutput = False,
) -> None:
    """Partitions, replication and configs of topics, and whether their dead-letter topics
    exist. Exit code 1 if a topic does not exist."""
    settings = _kafka_settings(kafka_bootstrap_servers, topics, topic_names)

    async def run() -> tuple[list[TopicState], list[str]]:
        async with admin_client(settings, request_timeout=settings.connect_timeout) as admin:
            existing = set(await admin.list_topics())
        wanted = list(settings.topics)
        dlqs = [f"{t}{dlq_suffix}" for t in wanted if not t.endswith(dlq_suffix)]
        found = [t for t in dict.fromkeys(wanted + dlqs) if t in existing or t in wanted]
        states = await describe_topics(settings, found, request_timeout=settings.connect_timeout)
        return states, [t for t in dlqs if t not in existing]

    try:
        states, missing_dlqs = asyncio.run(run())
    except TopicsNotDescribedError as exc:
        _refused_describe(settings, exc)
    if json_output:
        typer.echo(
            json.dumps(
                {"topics": [asdict(s) for s in states], "missing_dead_letter_topics": missing_dlqs},
                indent=2,
            )
        )
        return
    for state in states:
        typer.echo(f"{state.name}: {_describe_state(state)}")
    for name in missing_dlqs:
        typer.echo(
            f"{name}: missing (an inbox on {name.removesuffix(dlq_suffix)} needs it: "
            f"`{create_command([name], dlq_suffix)}`)"
        )


@topics_app.command("sync")
def topics_sync(
    database_url: DatabaseUrl = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    topics: Topics = None,
    json_output: JsonOutput = False,
) -> None:
    """Record the topics' partition counts (from Kafka) in the database, so that writers can
    add events for them before a relay has started (the relay does this itself at start)."""
    settings = load(
        ConnectionSettings,
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        topics=topics,
    )
    if not settings.topics:
        raise fail_config(ConfigurationError("OUTBOXKIT_TOPICS is not set: give --topics"))
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    asyncio.run(preflight(settings, topics=settings.topics))
    try:
        counts = asyncio.run(sync_topics(settings, settings.topics))
    except (ConfigurationError, KafkaError, StorageUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if json_output:
        typer.echo(json.dumps(counts, indent=2))
    else:
        for topic, partitions in sorted(counts.items()):
            typer.echo(f"{topic}: {counted(partitions, 'partition')}")
