"""Every Kafka client outboxkit makes, built in one place from one settings object.

Producers, consumers, admin clients and the relay's low-level fencing client all come from
here, from :class:`~outboxkit.core.settings.KafkaConnectionSettings`: the brokers, TLS (trusted
authorities, a client certificate for mutual TLS, hostname verification), the SASL login (PLAIN,
SCRAM-SHA-256/512, OAUTHBEARER through a token provider) and any further aiokafka option the
operator gives (``OUTBOXKIT_KAFKA_CLIENT_OPTIONS``), each passed only to the clients that take
it. A security option is therefore added once, and a test keeps aiokafka's constructors out of
the rest of the product (``tests/unit/test_kafka_clients.py``).

What the product sets for its guarantees (idempotence, transactional ids, ``read_committed``,
offsets committed by hand) is passed by the caller and cannot be overridden by the operator's
options: the settings refuse them.
"""

from __future__ import annotations

import importlib
import inspect
import ssl
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.helpers import create_ssl_context

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import KafkaConnectionSettings

T = TypeVar("T")


def build(cls: type[T], settings: KafkaConnectionSettings, *args: Any, **options: Any) -> T:
    """A client of class ``cls`` (aiokafka's, or a subclass of one): the operator's options it
    takes, then the connection's, then the caller's ``options``."""
    check_client_options(settings)
    accepted = _parameters(cls)
    extra = {k: v for k, v in settings.kafka_client_options.items() if k in accepted}
    return cls(*args, **{**extra, **connection_options(settings), **options})


def producer(settings: KafkaConnectionSettings, **options: Any) -> AIOKafkaProducer:
    return build(AIOKafkaProducer, settings, **options)


def consumer(settings: KafkaConnectionSettings, *topics: str, **options: Any) -> AIOKafkaConsumer:
    return build(AIOKafkaConsumer, settings, *topics, **options)


def admin(settings: KafkaConnectionSettings, **options: Any) -> AIOKafkaAdminClient:
    return build(AIOKafkaAdminClient, settings, **options)


def client(settings: KafkaConnectionSettings, **options: Any) -> AIOKafkaClient:
    """aiokafka's low-level client (the relay's fencer sends InitProducerId with it)."""
    return build(AIOKafkaClient, settings, **options)


def connection_options(settings: KafkaConnectionSettings) -> dict[str, Any]:
    """The options every client takes: brokers, TLS and SASL."""
    options: dict[str, Any] = {
        "bootstrap_servers": list(settings.kafka_bootstrap_servers),
        "security_protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = ssl_context(settings)
    if settings.kafka_sasl_mechanism is not None:
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        if settings.kafka_sasl_username is not None:
            options["sasl_plain_username"] = settings.kafka_sasl_username
        if settings.kafka_sasl_password is not None:
            options["sasl_plain_password"] = settings.kafka_sasl_password.get_secret_value()
        if settings.kafka_sasl_oauth_token_provider is not None:
            options["sasl_oauth_token_provider"] = token_provider(
                settings.kafka_sasl_oauth_token_provider
            )
    return options


def ssl_context(settings: KafkaConnectionSettings) -> ssl.SSLContext:
    """TLS as the settings say: the given authorities (else the system's), the client's
    certificate for mutual TLS, hostname verification unless turned off."""
    key_password = settings.kafka_ssl_key_password
    try:
        context: ssl.SSLContext = create_ssl_context(
            cafile=_path(settings.kafka_ssl_ca_file),
            certfile=_path(settings.kafka_ssl_cert_file),
            keyfile=None
            if settings.kafka_ssl_key_file is None
            else str(settings.kafka_ssl_key_file),
            password=None if key_password is None else key_password.get_secret_value(),
        )
    except OSError as exc:  # ssl.SSLError too
        raise ConfigurationError(
            "OUTBOXKIT_KAFKA_SSL_*: cannot load the TLS files "
            f"({type(exc).__name__}: {exc.strerror or exc}); check that they are PEM and that "
            "the key matches the certificate"
        ) from None
    if settings.kafka_ssl_ca_file is None:
        context.load_default_certs()
    context.check_hostname = settings.kafka_ssl_check_hostname
    return context


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def token_provider(name: str) -> AbstractTokenProvider:
    """The OAUTHBEARER token provider named ``module:name``: an instance, a class or a function
    without arguments that returns one."""
    module_name, _, attribute = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"OUTBOXKIT_KAFKA_SASL_OAUTH_TOKEN_PROVIDER: cannot import {name} ({exc})"
        ) from None
    provider = (
        found() if callable(found) and not isinstance(found, AbstractTokenProvider) else found
    )
    if not isinstance(provider, AbstractTokenProvider):
        raise ConfigurationError(
            f"OUTBOXKIT_KAFKA_SASL_OAUTH_TOKEN_PROVIDER: {name} gave a "
            f"{type(provider).__name__}, not an aiokafka.abc.AbstractTokenProvider"
        )
    return provider


def check_client_options(settings: KafkaConnectionSettings) -> None:
    """Refuse an option of ``OUTBOXKIT_KAFKA_CLIENT_OPTIONS`` that no aiokafka client takes."""
    known = set().union(
        *(_parameters(c) for c in (AIOKafkaProducer, AIOKafkaConsumer, AIOKafkaAdminClient))
    )
    unknown = sorted(set(settings.kafka_client_options) - known)
    if unknown:
        raise ConfigurationError(
            f"OUTBOXKIT_KAFKA_CLIENT_OPTIONS: {', '.join(unknown)} is no aiokafka client "
            "option (names as in AIOKafkaProducer/AIOKafkaConsumer, e.g. metadata_max_age_ms)"
        )


_NAMED = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_PARAMETERS: dict[type, frozenset[str]] = {}


def _parameters(cls: type) -> frozenset[str]:
    """The keyword parameters of ``cls``'s constructor (of the first class in its MRO that
    names any: a subclass that takes ``**config`` passes them to its base)."""
    if cls not in _PARAMETERS:
        names: set[str] = set()
        for klass in cls.__mro__:
            init = vars(klass).get("__init__")
            if init is not None:
                parameters = inspect.signature(init).parameters.items()
                names = {n for n, p in parameters if p.kind in _NAMED} - {"self", "loop"}
            if names:
                break
        _PARAMETERS[cls] = frozenset(names)
    return _PARAMETERS[cls]
