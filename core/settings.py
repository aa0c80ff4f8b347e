"""Settings shared by every outboxkit component: where the database and the broker are.

Each component (relay, inbox, pipeline) has one settings object that extends
:class:`ConnectionSettings`. Values come from keyword arguments, then ``OUTBOXKIT_*``
environment variables; they are validated once, at start, and frozen. :func:`load_settings`
turns a validation failure into a :class:`~outboxkit.ConfigurationError` whose message names
the environment variable and says what to put there.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from outboxkit.core.drivers import missing_driver
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.redact import redact, unreadable

ENV_PREFIX = "OUTBOXKIT_"

S = TypeVar("S", bound=BaseSettings)

DatabaseKind = Literal["postgresql", "mongodb", "memory"]

#: Which event loop a worker's command runs on (:attr:`WorkerSettings.event_loop`).
EventLoop = Literal["asyncio", "uvloop"]
_SCHEMES: dict[str, DatabaseKind] = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mongodb": "mongodb",
    "mongodb+srv": "mongodb",
    # Tests only: one process, nothing survives it (outboxkit.backends, outboxkit.testing).
    "memory": "memory",
}


def url_scheme(url: str) -> str:
    """The scheme of ``url`` (lower case), or ``""``. Not ``urlsplit``: that reads a password
    with ``#``, ``[`` or ``/`` differently from the drivers, or raises."""
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", url)
    return match.group(1).lower() if match else ""


def database_kind(url: str) -> DatabaseKind:
    """Which database ``url`` names (its scheme)."""
    return _SCHEMES[url_scheme(url)]


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


def _parse_json_object(value: object) -> object:
    """A JSON setting read from the environment: text that is not JSON is a validation error
    of its own field (pydantic-settings' own decoding would stop the whole load instead, naming
    no variable)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not JSON ({exc.msg} at column {exc.colno}): write a JSON object, keys and strings "
            'in double quotes, e.g. {"metadata_max_age_ms": 60000}'
        ) from None
    if not isinstance(parsed, dict):  # the value is not quoted: it may hold a secret
        kind = "an array" if isinstance(parsed, list) else "a single value"
        raise ValueError(f'a JSON object is expected ({{"name": value, …}}), not {kind}')
    return parsed


#: A setting given as a JSON object ('{"linger_ms": 5}'), a dict in Python. Every setting
#: parsed from JSON uses it (tests/unit/test_settings.py checks): a malformed value is then one
#: line naming its variable, among the other invalid settings, and exit code 2.
JsonObject = Annotated[dict[str, Any], NoDecode, BeforeValidator(_parse_json_object)]

#: Kafka bootstrap servers: comma-separated host:port pairs.
BootstrapServers = Annotated[CommaList, AfterValidator(_require_host_ports)]


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

#: Client options the guarantees rest on, or that the security settings set: never taken from
#: OUTBOXKIT_KAFKA_CLIENT_OPTIONS. The relay's producers are idempotent and transactional, the
#: inbox reads committed records only and commits its offsets itself.
PROTECTED_CLIENT_OPTIONS = frozenset(
    {
        "bootstrap_servers",
        "acks",
        "enable_idempotence",
        "transactional_id",
        "transaction_timeout_ms",
        "isolation_level",
        "enable_auto_commit",
        "group_id",
        "group_instance_id",
        "auto_offset_reset",
        "partition_assignment_strategy",
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_oauth_token_provider",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "api_version",
        "key_serializer",
        "value_serializer",
        "key_deserializer",
        "value_deserializer",
    }
)


def _empty_is_unset(value: object) -> object:
    """An environment variable set to "" leaves an optional setting unset."""
    return None if value == "" else value


#: An optional setting: unset when its variable is empty.
EmptyIsUnset = BeforeValidator(_empty_is_unset)


def _file(value: Path | None) -> Path | None:
    if value is not None and not value.is_file():
        raise ValueError(f"{value} is not a readable file")
    return value


#: A path setting that must name an existing file (an empty variable leaves it unset).
ExistingFile = Annotated[Path | None, EmptyIsUnset, AfterValidator(_file)]


class KafkaConnectionSettings(BaseSettings):
    """Where the Kafka cluster is and how to log in: every Kafka client outboxkit makes is
    built from these (:mod:`outboxkit.core.kafka_clients`). A validation error never shows
    what was given (a password could be in it)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        validate_default=True,
        hide_input_in_errors=True,
    )

    kafka_bootstrap_servers: BootstrapServers = Field(
        default=["localhost:9092"],
        min_length=1,
        description="Kafka brokers to bootstrap from, comma-separated host:port pairs",
    )
    kafka_security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT",
        description="How clients talk to the brokers: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or "
        "SASL_SSL (TLS and a SASL login, what managed Kafka services require)",
    )
    kafka_sasl_mechanism: Annotated[SaslMechanism | None, EmptyIsUnset] = Field(
        default=None,
        description="SASL mechanism with SASL_SSL or SASL_PLAINTEXT: PLAIN, SCRAM-SHA-256, "
        "SCRAM-SHA-512 or OAUTHBEARER",
    )
    kafka_sasl_username: Annotated[str | None, EmptyIsUnset] = Field(
        default=None, description="SASL user name (PLAIN, SCRAM)"
    )
    kafka_sasl_password: Annotated[SecretStr | None, EmptyIsUnset] = Field(
        default=None, description="SASL password (PLAIN, SCRAM); never printed or logged"
    )
    kafka_sasl_oauth_token_provider: Annotated[str | None, EmptyIsUnset] = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="OAUTHBEARER: module:name of an aiokafka AbstractTokenProvider, or of a "
        "function without arguments that returns one (e.g. an MSK IAM or OAuth client's)",
    )
    kafka_ssl_ca_file: ExistingFile = Field(
        default=None,
        description="PEM file of the certificate authorities to trust (SSL, SASL_SSL); the "
        "system's trusted authorities when unset",
    )
    kafka_ssl_cert_file: ExistingFile = Field(
        default=None,
        description="PEM file of this client's certificate, for mutual TLS (with the key file)",
    )
    kafka_ssl_key_file: ExistingFile = Field(
        default=None, description="PEM file of this client's private key, for mutual TLS"
    )
    kafka_ssl_key_password: Annotated[SecretStr | None, EmptyIsUnset] = Field(
        default=None, description="Password of the client's private key, if it is encrypted"
    )
    kafka_ssl_check_hostname: bool = Field(
        default=True,
        description="Check that the broker's certificate names the host connected to; turn "
        "off only for brokers whose certificates cannot be fixed",
    )
    kafka_client_options: JsonObject = Field(
        default={},
        description='More aiokafka client options, as JSON (e.g. {"metadata_max_age_ms": '
        "60000}); options the guarantees or the security settings set are refused",
    )

    @field_validator("kafka_client_options")
    @classmethod
    def _no_protected_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        refused = sorted(PROTECTED_CLIENT_OPTIONS & set(options))
        if refused:
            raise ValueError(
                f"{', '.join(refused)} cannot be set here: outboxkit sets them itself (its "
                "guarantees rest on them) or from the OUTBOXKIT_KAFKA_SECURITY_PROTOCOL, "
                "OUTBOXKIT_KAFKA_SASL_* and OUTBOXKIT_KAFKA_SSL_* settings"
            )
        return options

    @model_validator(mode="after")
    def _security_is_complete(self) -> Self:
        protocol = self.kafka_security_protocol
        mechanism = self.kafka_sasl_mechanism
        sasl = protocol.startswith("SASL_")
        problems = []
        if sasl and mechanism is None:
            problems.append(
                f"OUTBOXKIT_KAFKA_SASL_MECHANISM is not set: {protocol} needs one of PLAIN, "
                "SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"
            )
        if not sasl and (mechanism or self.kafka_sasl_username or self.kafka_sasl_password):
            problems.append(
                f"OUTBOXKIT_KAFKA_SASL_* is set but OUTBOXKIT_KAFKA_SECURITY_PROTOCOL is "
                f"{protocol}: use SASL_SSL (or SASL_PLAINTEXT) to log in"
            )
        if (
            sasl
            and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
            and not (self.kafka_sasl_username and self.kafka_sasl_password)
        ):
            problems.append(
                f"{mechanism} needs OUTBOXKIT_KAFKA_SASL_USERNAME and OUTBOXKIT_KAFKA_SASL_PASSWORD"
            )
        if mechanism == "OAUTHBEARER" and not self.kafka_sasl_oauth_token_provider:
            problems.append("OAUTHBEARER needs OUTBOXKIT_KAFKA_SASL_OAUTH_TOKEN_PROVIDER")
        if (self.kafka_ssl_cert_file is None) != (self.kafka_ssl_key_file is None):
            problems.append(
                "mutual TLS needs both OUTBOXKIT_KAFKA_SSL_CERT_FILE and "
                "OUTBOXKIT_KAFKA_SSL_KEY_FILE"
            )
        tls_files = self.kafka_ssl_ca_file or self.kafka_ssl_cert_file
        if tls_files and protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
            problems.append(
                f"OUTBOXKIT_KAFKA_SSL_* is set but OUTBOXKIT_KAFKA_SECURITY_PROTOCOL is "
                f"{protocol}: use SSL or SASL_SSL"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def open_broker(servers: list[str]) -> KafkaConnectionSettings:
    """The Kafka settings of an open (PLAINTEXT) broker that this process started itself (the
    demo, the example runners, the testing plugin): no ``OUTBOXKIT_KAFKA_*`` variable applies."""
    return KafkaConnectionSettings.model_construct(kafka_bootstrap_servers=servers)


class ConnectionSettings(KafkaConnectionSettings):
    """Where the database and the Kafka cluster are.

    The database URL holds a password: validation errors never quote an input, and the
    settings' ``repr`` shows the URL redacted (:func:`~outboxkit.core.redact.redact`)."""

    database_url: str = Field(
        description=(
            "The database holding the outbox/inbox tables, e.g. "
            "postgresql://user:password@host:5432/dbname or "
            "mongodb://host:27017/dbname?replicaSet=rs0"
        ),
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
        scheme = url_scheme(value)
        if scheme not in _SCHEMES:
            raise ValueError(f"unsupported scheme {scheme!r}: use postgresql://… or mongodb://…")
        if (missing := missing_driver(_SCHEMES[scheme])) is not None:
            raise ValueError(missing)
        # What the driver would misread is refused here, before the driver's own error could
        # quote the piece it could not read (a piece of the password, maybe).
        problem = unreadable(value)
        if problem is not None:
            raise ValueError(problem)
        if _SCHEMES[scheme] == "mongodb":
            from outboxkit.core.mongodb import database_name  # noqa: PLC0415 - imports pymongo

            try:
                database_name(value)
            except ConfigurationError:
                raise ValueError(
                    "name the database in the MongoDB URL's path, e.g. "
                    "mongodb://host:27017/shop?replicaSet=rs0 (outboxkit's collections go there)"
                ) from None
        return value

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, redact(value) if name == "database_url" else value

    @property
    def database_kind(self) -> DatabaseKind:
        return database_kind(self.database_url)


class KafkaSettings(KafkaConnectionSettings):
    """Where the Kafka cluster is: for the commands that need no database (``topics create``)."""

    # The rest of the configuration is KafkaConnectionSettings': pydantic merges it.
    model_config = SettingsConfigDict(extra="ignore")

    topics: CommaList = Field(default=[])
    connect_timeout: float = Field(default=10.0, gt=0)


class WorkerSettings(ConnectionSettings):
    """What every long-running worker (relay, inbox) shares: its topics and its group timing.

    The checks are field validators (not one model validator, which pydantic runs only once
    every field is valid), so that every invalid or missing setting is reported at once."""

    session_timeout: float = Field(
        default=10.0, ge=1.0, description="Seconds without heartbeats before a worker is replaced"
    )
    heartbeat_interval: float = Field(default=1.0, gt=0, description="Seconds between heartbeats")
    retry_backoff_max: float = Field(
        default=5.0, gt=0, description="Longest wait between retries after an error"
    )
    database_timeout: float = Field(
        default=45.0,
        ge=1.0,
        description="Seconds a worker waits for the database to send anything while a "
        "statement, commit or other operation waits for it; past that it closes the connection "
        'and retries ("database unavailable"). Ends the hang of a half-open link (data '
        "stops, the socket stays open), which TCP may take 15 minutes or more to notice. Keep "
        "it above the longest statement (outboxkit's connections run with a 30 s "
        "statement_timeout) and MongoDB operation; it is MongoDB's socketTimeoutMS",
    )
    step_aside_after: float = Field(
        default=30.0,
        ge=0,
        description="Seconds a worker may go without an answer from its database (a relay: "
        "every backlog measure failing, nothing published; an inbox worker: its transactions "
        "failing) before it leaves its consumer group, so that the workers that reach the "
        "database take its partitions; it rejoins once its database answers. 0: never (its "
        "partitions wait for it)",
    )
    startup_grace: float = Field(
        default=60.0,
        ge=0,
        description="Seconds a worker waits at start for a database or broker that does not "
        "answer yet (restarting, failing over), with a warning every few seconds, before it "
        "exits with the error; what waiting cannot fix (a refused login, missing tables or "
        "topics) stops it at once",
    )

    event_loop: EventLoop = Field(
        default="asyncio",
        description="The event loop of `outboxkit relay` and `outboxkit inbox`: `asyncio`, or "
        "`uvloop` (the `uvloop` extra). uvloop saves a MongoDB inbox worker whose handlers write "
        "about a tenth of its CPU, and costs a PostgreSQL one about as much (docs/inbox.md, "
        '"Throughput"). A worker embedded in an app runs on the app\'s loop',
    )

    @field_validator("event_loop")
    @classmethod
    def _event_loop_installed(cls, event_loop: EventLoop) -> EventLoop:
        if event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError(
                "uvloop is not installed: pip install 'outboxkit[uvloop]', or set asyncio"
            )
        return event_loop

    @field_validator("topics")
    @classmethod
    def _worker_needs_topics(cls, topics: list[str]) -> list[str]:
        if not topics:
            raise ValueError("not set: a worker needs the topics it works on, comma-separated")
        return topics

    @field_validator("heartbeat_interval")
    @classmethod
    def _heartbeat_within_session(cls, interval: float, info: ValidationInfo) -> float:
        session = info.data.get("session_timeout")  # absent when it is itself invalid
        if session is not None and interval * 3 > session:
            raise ValueError(
                "must be at most a third of OUTBOXKIT_SESSION_TIMEOUT "
                f"({session:g} s), or the group drops a live worker"
            )
        return interval


def load_settings(cls: type[S], **values: Any) -> S:
    """Build ``cls`` from ``values`` (``None`` means "not given") and the environment.

    Raises :class:`ConfigurationError` listing each bad setting by its environment variable."""
    given = {name: value for name, value in values.items() if value is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc, cls)) from None
    except SettingsError as exc:  # a value pydantic-settings could not decode (JSON)
        raise ConfigurationError(_describe_settings_error(exc)) from None


def _describe_settings_error(exc: SettingsError) -> str:
    """``error parsing value for field "x" from source "EnvSettingsSource"``, said as the other
    invalid settings are: by the variable."""
    found = re.search(r'field "([^"]+)"', str(exc))
    if found is None:
        return f"invalid configuration: {exc}"
    return f"invalid configuration:\n  {ENV_PREFIX}{found.group(1).upper()}: not valid JSON"


def describe_validation_error(exc: ValidationError, cls: type[BaseSettings]) -> str:
    """Every problem of ``exc``, one line each, named by its environment variable."""
    lines = ["invalid configuration:"]
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        env_var = f"{ENV_PREFIX}{field.upper()}"
        info = cls.model_fields.get(field)
        problem = error["msg"].removeprefix("Value error, ")
        if not field:  # a check across settings: its message names them itself
            line = f"  {problem}"
        elif error["type"] == "missing" and info is not None and info.description:
            line = f"  {env_var} is not set: {info.description[0].lower()}{info.description[1:]}"
        elif error["type"] == "extra_forbidden":
            line = f"  {field}: unknown setting"
        elif problem.startswith("not set:"):
            line = f"  {env_var} is {problem}"
        else:
            line = f"  {env_var}: {problem}"
        lines.append(line)
    return "\n".join(lines)
