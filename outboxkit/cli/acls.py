"""``outboxkit acls relay`` and ``outboxkit acls inbox``: the Kafka ACLs a worker needs, as
``kafka-acls.sh`` commands (outboxkit/preflight/kafka_acls.py; docs/security.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from outboxkit.cli.common import fail_config
from outboxkit.cli.relay import RelayName
from outboxkit.cli_options import BootstrapServers, DlqSuffix, JsonOutput, Topics
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.preflight.kafka_acls import Acl, inbox_acls, relay_acls

acls_app = typer.Typer(
    help="The Kafka ACLs each worker needs, and no more, as kafka-acls.sh commands.",
    no_args_is_help=True,
)

Principal = Annotated[
    str,
    typer.Option(
        metavar="PRINCIPAL", help="Who gets them: User:<SASL user>, or User:CN=… for mutual TLS."
    ),
]


def _topics(topics: str | None) -> list[str]:
    names = [t.strip() for t in (topics or "").split(",") if t.strip()]
    if not names:
        raise fail_config(ConfigurationError("OUTBOXKIT_TOPICS is not set: give --topics"))
    return names


def _show(acls: list[Acl], principal: str, servers: str | None, json_output: bool) -> None:
    if json_output:
        typer.echo(json.dumps([asdict(acl) for acl in acls], indent=2))
        return
    for acl in acls:
        typer.echo(f"# {acl.why}")
        typer.echo(acl.kafka_acls_command(principal, servers or "$BOOTSTRAP"))


@acls_app.command("relay")
def relay(
    principal: Principal,
    *,
    relay_name: RelayName = None,
    topics: Topics = None,
    kafka_bootstrap_servers: BootstrapServers = None,
    no_transactions: Annotated[
        bool, typer.Option("--no-transactions", help="OUTBOXKIT_TRANSACTIONAL=false relays.")
    ] = False,
    json_output: JsonOutput = False,
) -> None:
    """What `outboxkit relay` needs: WRITE and READ on its topics, READ on its group, WRITE on
    its transactional ids (prefixed)."""
    group = f"outboxkit.relay.{relay_name or 'default'}"
    acls = relay_acls(group, _topics(topics), transactional=not no_transactions)
    _show(acls, principal, kafka_bootstrap_servers, json_output)


@acls_app.command("inbox")
def inbox(
    principal: Principal,
    *,
    name: Annotated[str, typer.Option(metavar="NAME", help="The Inbox's name (Inbox(name=…)).")],
    topics: Topics = None,
    dlq_suffix: DlqSuffix = ".dlq",
    kafka_bootstrap_servers: BootstrapServers = None,
    json_output: JsonOutput = False,
) -> None:
    """What `outboxkit inbox` needs: READ on its topics and group, WRITE on their dead-letter
    topics."""
    acls = inbox_acls(f"outboxkit.inbox.{name}", _topics(topics), dlq_suffix)
    _show(acls, principal, kafka_bootstrap_servers, json_output)
