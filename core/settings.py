"""Settings shared by every outboxkit component: where the database and the broker are.

Each component (relay, inbox, pipeline) has one settings object that extends
:class:`ConnectionSettings`. Values come from keyword arguments, then ``OUTBOXKIT_*``
environment variables; they are validated once, at start, and frozen. :func:`load_settings`
turns a validation failure into a :class:`~outboxkit.ConfigurationError` whose message names
the environment variable and says what to put there.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Annotated, Any, Literal, Self, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from outboxkit.core.exceptions import ConfigurationError

ENV_PREFIX = "OUTBOXKIT_"

S = TypeVar("S", bound=BaseSettings)

DatabaseKind = Literal["postgresql", "mongodb", "memory"]
_SCHEMES: dict[str, DatabaseKind] = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mongodb": "mongodb",
    "mongodb+srv": "mongodb",
    # Tests only: one process, nothing survives it (outboxkit.backends, outboxkit.testing).
    "memory": "memory",
}


def database_kind(url: str) -> DatabaseKind:
    """Which database ``url`` names (its scheme)."""
    return _SCHEMES[urlsplit(url).scheme]


def _seconds_or_iso(value: object) -> object:
    """Environment variables are strings: read "90" or "1.5" as seconds (ISO 8601 "PT90S",
    "P7D" and pydantic's other forms pass through)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return timedelta(seconds=float(value))
    return value


#: A duration setting: seconds ("3600") or ISO 8601 ("P7D", "PT1H").
Duration = Annotated[timedelta, BeforeValidator(_seconds_or_iso)]


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _require_host_ports(servers: list[str]) -> list[str]:
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{server!r} is not host:port")
    return servers


#: A list setting: comma-separated in the environment ("a,b"), a list in Python.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_commas)]

#: Kafka bootstrap servers: comma-separated host:port pairs.
BootstrapServers = Annotated[CommaList, AfterValidator(_require_host_ports)]


class ConnectionSettings(BaseSettings):
    """Where the database and the Kafka cluster are."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", validate_default=True
    )

    database_url: str = Field(
        description=(
            "The database holding the outbox/inbox tables, e.g. "
            "postgresql://user:password@host:5432/dbname or "
            "mongodb://host:27017/dbname?replicaSet=rs0"
        ),
    )
    kafka_bootstrap_servers: BootstrapServers = Field(
        default=["localhost:9092"],
        min_length=1,
        description="Kafka brokers to bootstrap from, comma-separated host:port pairs",
    )
    topics: CommaList = Field(
        default=[],
        description="Kafka topics this component publishes to or consumes, comma-separated",
    )
    connect_timeout: float = Field(
        default=10.0, gt=0, description="Seconds to wait when connecting to the database or broker"
    )

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in _SCHEMES:
            raise ValueError(
                f"unsupported scheme {parts.scheme!r}: use postgresql://… or mongodb://…"
            )
        if _SCHEMES[parts.scheme] == "mongodb" and not parts.path.strip("/"):
            raise ValueError(
                "name the database in the MongoDB URL's path, e.g. "
                "mongodb://host:27017/shop?replicaSet=rs0 (outboxkit's collections go there)"
            )
        return value

    @property
    def database_kind(self) -> DatabaseKind:
        return database_kind(self.database_url)


class WorkerSettings(ConnectionSettings):
    """What every long-running worker (relay, inbox) shares: its topics and its group timing."""

    session_timeout: float = Field(
        default=10.0, ge=1.0, description="Seconds without heartbeats before a worker is replaced"
    )
    heartbeat_interval: float = Field(default=1.0, gt=0, description="Seconds between heartbeats")
    retry_backoff_max: float = Field(
        default=5.0, gt=0, description="Longest wait between retries after an error"
    )

    @model_validator(mode="after")
    def _worker_coherent(self) -> Self:
        if not self.topics:
            raise ValueError("OUTBOXKIT_TOPICS: a worker needs the topics it works on")
        if self.heartbeat_interval * 3 > self.session_timeout:
            raise ValueError(
                "OUTBOXKIT_HEARTBEAT_INTERVAL must be at most a third of OUTBOXKIT_SESSION_TIMEOUT"
            )
        return self


def load_settings(cls: type[S], **values: Any) -> S:
    """Build ``cls`` from ``values`` (``None`` means "not given") and the environment.

    Raises :class:`ConfigurationError` listing each bad setting by its environment variable."""
    given = {name: value for name, value in values.items() if value is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc, cls)) from None


def describe_validation_error(exc: ValidationError, cls: type[BaseSettings]) -> str:
    lines = ["invalid configuration:"]
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        env_var = f"{ENV_PREFIX}{field.upper()}"
        info = cls.model_fields.get(field)
        problem = error["msg"].removeprefix("Value error, ")
        line = f"  {env_var}: {problem}"
        if error["type"] == "missing" and info is not None and info.description:
            line = f"  {env_var} is not set: {info.description[0].lower()}{info.description[1:]}"
        elif error["type"] == "extra_forbidden":
            line = f"  {field}: unknown setting"
        lines.append(line)
    return "\n".join(lines)
