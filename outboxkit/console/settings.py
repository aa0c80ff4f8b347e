"""The console's settings: one validated, frozen object (``OUTBOXKIT_*`` variables, its own
under ``OUTBOXKIT_CONSOLE_*``). Importable without the ``[console]`` extra: the configuration
reference and the unknown-variable check read it in every process."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr, field_validator

from outboxkit.core.settings import CommaList, ConnectionSettings, EmptyIsUnset

__all__ = ["ConsoleSettings", "InboxView"]

#: The shortest token or key the console takes.
MIN_SECRET = 16

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _inbox_views(entries: list[str]) -> list[str]:
    for entry in entries:
        name, _, topic = entry.partition(":")
        if not (_NAME.match(name) and _NAME.match(topic)):
            raise ValueError(
                f"{entry!r} is not name:topic (an inbox's name, the topic it consumes; an inbox "
                "of several topics is named once per topic: orders:payments,orders:refunds)"
            )
    return entries


@dataclass(frozen=True)
class InboxView:
    """An inbox the console shows: its name and the topics it consumes."""

    name: str
    topics: tuple[str, ...]

    @property
    def group(self) -> str:
        return f"outboxkit.inbox.{self.name}"


class ConsoleSettings(ConnectionSettings):
    """What the console shows and who may act through it. ``OUTBOXKIT_TOPICS`` are the topics
    the outbox publishes (the relay's); the inboxes are named with their topics."""

    relay_name: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Relay name: its consumer group is outboxkit.relay.<name>; relays of one "
        "outbox share the name",
    )
    dlq_suffix: str = Field(
        default=".dlq",
        min_length=1,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="Dead-letter topic of a topic: <topic><suffix> (the topic must exist)",
    )
    stall_after: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a partition may have records pending without progress before the "
        "worker reports it stalled (unhealthy)",
    )
    console_inboxes: Annotated[CommaList, AfterValidator(_inbox_views)] = Field(
        default=[],
        description="The inboxes the console shows (their lag, their dead letters), as "
        "name:topic pairs, comma-separated: orders:payments,payments:orders. A mounted console "
        "shows its service's inbox without it",
    )
    console_actions: bool = Field(
        default=False,
        description="Let operators act from the console (retry and skip parked records, replay "
        "dead letters). Off: the console only reads. On, every action needs a login "
        "(OUTBOXKIT_CONSOLE_TOKEN, or the host app's dependency) and a CSRF token, and is "
        "written to the log as an audit line",
    )
    console_token: Annotated[SecretStr | None, EmptyIsUnset] = Field(
        default=None,
        description="The token that logs into the console (as a bearer token, or once in its "
        "login form for a session cookie), 16 characters or more. Set: every page needs it. "
        "Never printed or logged",
    )
    console_secret: Annotated[SecretStr | None, EmptyIsUnset] = Field(
        default=None,
        description="Key that signs the console's session cookies and CSRF tokens; a random one "
        "per process when unset (sessions then end at a restart: set it when several replicas "
        "serve the console). Never printed or logged",
    )
    console_session_ttl: float = Field(
        default=8 * 3600.0, gt=0, description="Seconds a console login lasts"
    )
    console_refresh: float = Field(
        default=5.0,
        ge=1.0,
        description="Seconds between two reads of the overview's figures: its page refreshes at "
        "this pace, and viewers share each read (one backlog query per refresh, however many "
        "watch)",
    )
    console_history: float = Field(
        default=900.0,
        ge=60.0,
        description="Seconds of backlog and lag the overview's chart keeps (in memory)",
    )
    console_page_size: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Most records a page lists: failed records, dead letters read per inbox "
        "(the first ones of its dead-letter topics); no page reads more",
    )
    console_payload_limit: int = Field(
        default=2000,
        ge=100,
        description="Characters of a dead letter's payload shown; a longer one is cut",
    )
    console_sensitive_fields: CommaList = Field(
        default=[],
        description="Payload fields never shown, at any depth (e.g. card_number,email); their "
        "values are replaced by a mask",
    )
    console_registry: Annotated[str | None, EmptyIsUnset] = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$",
        description="Your EventRegistry as module[:attribute], for the Schemas page and the "
        "event types of dead letters (a mounted console takes its inbox's registry)",
    )

    @field_validator("console_token", "console_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SECRET:
            raise ValueError(
                f"at least {MIN_SECRET} characters: a short one can be guessed (e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @property
    def inbox_views(self) -> list[InboxView]:
        """The inboxes of :attr:`console_inboxes`, each with its topics in the order given."""
        topics: dict[str, list[str]] = {}
        for entry in self.console_inboxes:
            name, _, topic = entry.partition(":")
            topics.setdefault(name, [])
            if topic not in topics[name]:
                topics[name].append(topic)
        return [InboxView(name, tuple(found)) for name, found in topics.items()]
