"""Every Kafka client comes from core/kafka_clients.py, built from the Kafka settings: brokers,
TLS, SASL and the operator's extra options, which can never override what the guarantees set."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka import AIOKafkaClient
from aiokafka.abc import AbstractTokenProvider
from pydantic import ValidationError

from outboxkit.core import kafka_clients
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import KafkaSettings, load_settings
from outboxkit.pipeline.kafka_options import spark_kafka_options

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ["core", "relay", "inbox", "schemas", "pipeline", "outboxkit"]
#: Written as users write their code, with the public API and their own Kafka clients
#: (tests/unit/test_public_imports.py); they reach only the brokers they started.
USER_SIDE = ("outboxkit/demo/",)
CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "AIOKafkaClient"}
PASSWORD = 'pa ss"w0rd\\;#@/:%'


def test_no_kafka_client_is_constructed_outside_the_factory() -> None:
    """One place builds clients, so a security option is added once. Subclasses (the relay's
    producer, the inbox's consumer) are built there too, through ``kafka_clients.build``."""
    subclasses: set[str] = set()
    trees = {}
    for folder in PRODUCT:
        for path in (REPO / folder).rglob("*.py"):
            if str(path.relative_to(REPO)).startswith(USER_SIDE):
                continue
            trees[path] = tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", getattr(base, "attr", None)) in CLIENTS
                    for base in node.bases
                ):
                    subclasses.add(node.name)
    found = []
    for path, tree in trees.items():
        if path == REPO / "core" / "kafka_clients.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in CLIENTS | subclasses:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {name}(")
    assert subclasses, "the relay's and the inbox's client classes were looked for"
    assert not found, f"build these with outboxkit.core.kafka_clients: {found}"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    ca = trustme.CA()
    client = ca.issue_cert("relay")
    folder = tmp_path_factory.mktemp("tls")
    files = {"ca": folder / "ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    client.cert_chain_pems[0].write_to_path(str(files["cert"]))
    client.private_key_pem.write_to_path(str(files["key"]))
    return files


def scram(**more: Any) -> KafkaSettings:
    return KafkaSettings(
        kafka_bootstrap_servers=["broker:9093"],
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="relay",
        kafka_sasl_password=PASSWORD,
        **more,
    )


async def test_sasl_ssl_gives_every_client_tls_and_the_login(
    tls_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = scram(kafka_ssl_ca_file=tls_files["ca"])
    # Every aiokafka client connects through an AIOKafkaClient: what each one was given.
    given: list[dict[str, Any]] = []
    connect = AIOKafkaClient.__init__

    def recording(self: AIOKafkaClient, **options: Any) -> None:
        given.append(options)
        connect(self, **options)

    monkeypatch.setattr(AIOKafkaClient, "__init__", recording)
    options = kafka_clients.connection_options(settings)
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("relay", PASSWORD)
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    producer = kafka_clients.producer(settings)
    consumer = kafka_clients.consumer(settings)
    admin = kafka_clients.admin(settings)
    client = kafka_clients.client(settings)
    try:
        assert len(given) == 4  # the producer's, the consumer's, the admin's, the low-level one
        for options in given:
            assert options["security_protocol"] == "SASL_SSL"
            assert options["sasl_plain_password"] == PASSWORD
            assert isinstance(options["ssl_context"], ssl.SSLContext)
    finally:
        await producer.stop()
        await consumer.stop()
        await admin.close()
        await client.close()


def test_mutual_tls_loads_the_client_certificate(tls_files: dict[str, Path]) -> None:
    settings = KafkaSettings(
        kafka_security_protocol="SSL",
        kafka_ssl_ca_file=tls_files["ca"],
        kafka_ssl_cert_file=tls_files["cert"],
        kafka_ssl_key_file=tls_files["key"],
        kafka_ssl_check_hostname=False,
    )
    options = kafka_clients.connection_options(settings)
    assert "sasl_mechanism" not in options
    assert options["ssl_context"].check_hostname is False


def test_a_key_that_does_not_match_is_one_clear_error(tls_files: dict[str, Path]) -> None:
    other = trustme.CA().issue_cert("x")
    wrong_key = tls_files["key"].with_name("other-key.pem")
    other.private_key_pem.write_to_path(str(wrong_key))
    settings = KafkaSettings(
        kafka_security_protocol="SSL",
        kafka_ssl_cert_file=tls_files["cert"],
        kafka_ssl_key_file=wrong_key,
    )
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_KAFKA_SSL_"):
        kafka_clients.connection_options(settings)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "OUTBOXKIT_KAFKA_SASL_MECHANISM is not set"),
        (
            {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "PLAIN"},
            "PLAIN needs OUTBOXKIT_KAFKA_SASL_USERNAME and OUTBOXKIT_KAFKA_SASL_PASSWORD",
        ),
        ({"kafka_sasl_mechanism": "PLAIN"}, "use SASL_SSL"),
        (
            {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "OAUTHBEARER"},
            "OAUTHBEARER needs OUTBOXKIT_KAFKA_SASL_OAUTH_TOKEN_PROVIDER",
        ),
        ({"kafka_ssl_ca_file": "/no/such/ca.pem"}, "is not a readable file"),
        ({"kafka_client_options": '{"enable_idempotence": false}'}, "enable_idempotence cannot"),
        ({"kafka_client_options": '{"isolation_level": "read_uncommitted"}'}, "isolation_level"),
        ({"kafka_client_options": '{"sasl_plain_password": "x"}'}, "sasl_plain_password"),
    ],
)
def test_incomplete_or_unsafe_settings_are_refused_at_start(
    values: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"OUTBOXKIT_{name.upper()}", value)
    with pytest.raises(ConfigurationError, match=message):
        load_settings(KafkaSettings)


class _Producer:
    """Takes what a producer takes that matters here, and records it."""

    def __init__(self, *, linger_ms: int = 0, client_id: str = "", **connection: Any) -> None:
        self.linger_ms, self.client_id, self.connection = linger_ms, client_id, connection


class _Admin:
    def __init__(self, *, metadata_max_age_ms: int = 0, **connection: Any) -> None:
        self.metadata_max_age_ms, self.connection = metadata_max_age_ms, connection


def test_extra_options_reach_only_the_clients_that_take_them() -> None:
    settings = KafkaSettings(kafka_client_options={"linger_ms": 7, "metadata_max_age_ms": 60_000})
    producer = kafka_clients.build(_Producer, settings)
    assert producer.linger_ms == 7
    assert "metadata_max_age_ms" not in producer.connection
    admin = kafka_clients.build(_Admin, settings)
    assert admin.metadata_max_age_ms == 60_000
    assert "linger_ms" not in admin.connection
    assert admin.connection["bootstrap_servers"] == ["localhost:9092"]


def test_the_product_wins_over_the_operators_options() -> None:
    settings = KafkaSettings(kafka_client_options={"client_id": "operator"})
    assert kafka_clients.build(_Producer, settings, client_id="relay").client_id == "relay"
    assert kafka_clients.build(_Producer, settings).client_id == "operator"


def test_an_option_no_client_takes_is_refused() -> None:
    settings = KafkaSettings(kafka_client_options={"lingerms": 5})
    with pytest.raises(ConfigurationError, match="lingerms is no aiokafka client option"):
        kafka_clients.producer(settings)


class _Tokens(AbstractTokenProvider):  # type: ignore[misc]
    async def token(self) -> str:
        return "t"


def make_tokens() -> _Tokens:
    return _Tokens()


def test_an_oauth_token_provider_is_named_module_colon_name() -> None:
    module = __name__
    for name in (f"{module}:_Tokens", f"{module}:make_tokens"):
        assert isinstance(kafka_clients.token_provider(name), _Tokens)
    with pytest.raises(ConfigurationError, match="cannot import"):
        kafka_clients.token_provider(f"{module}:missing")
    with pytest.raises(ConfigurationError, match="not an aiokafka"):
        kafka_clients.token_provider(f"{module}:scram")


def test_the_password_is_in_no_text_of_the_settings() -> None:
    settings = scram()
    assert PASSWORD not in repr(settings)
    assert PASSWORD not in str(settings)
    assert PASSWORD not in settings.model_dump_json()
    with pytest.raises(ConfigurationError) as refused:
        load_settings(KafkaSettings, kafka_sasl_password=PASSWORD, kafka_sasl_mechanism="PLAIN")
    assert PASSWORD not in str(refused.value)


def test_spark_gets_the_same_connection_as_jvm_kafka_options(tls_files: dict[str, Path]) -> None:
    settings = scram(
        kafka_ssl_ca_file=tls_files["ca"],
        kafka_ssl_cert_file=tls_files["cert"],
        kafka_ssl_key_file=tls_files["key"],
    )
    options = spark_kafka_options(settings)
    assert options["kafka.bootstrap.servers"] == "broker:9093"
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    escaped = PASSWORD.replace("\\", "\\\\").replace('"', '\\"')
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="relay" password="{escaped}";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == str(tls_files["ca"])
    key_store = Path(options["kafka.ssl.keystore.location"])
    assert key_store.stat().st_mode & 0o077 == 0, "the key store is private"
    assert "PRIVATE KEY" in key_store.read_text()
    assert "CERTIFICATE" in key_store.read_text()
    assert options["kafka.ssl.endpoint.identification.algorithm"] == "https"
    oauth = KafkaSettings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="OAUTHBEARER",
        kafka_sasl_oauth_token_provider=f"{__name__}:make_tokens",
    )
    with pytest.raises(ConfigurationError, match="PLAIN or SCRAM only"):
        spark_kafka_options(oauth)


def test_a_raw_validation_error_does_not_show_the_password() -> None:
    """Code that builds settings itself sees pydantic's error, never the input."""
    with pytest.raises(ValidationError) as refused:
        KafkaSettings(
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism="PLAIN",
            kafka_sasl_password=PASSWORD,
            kafka_client_options={"acks": 0},
        )
    assert PASSWORD not in str(refused.value)
