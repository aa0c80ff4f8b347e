"""The Spark Kafka source's options, from the same settings as every other Kafka client.

Spark's Kafka source takes the JVM Kafka client's properties prefixed with ``kafka.``: the
protocol, the SASL mechanism and a JAAS login line, PEM trust and key stores, hostname checks.
The password goes only into ``kafka.sasl.jaas.config``; :func:`redact_in_plans` makes Spark
print that option redacted in query plans and the UI (Spark's own patterns do not cover it).
``OUTBOXKIT_KAFKA_CLIENT_OPTIONS`` names aiokafka options and is not passed to the JVM.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import KafkaConnectionSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

#: Option names Spark must redact in plans and the UI (added to spark.sql.redaction.options.regex).
REDACTED_OPTIONS = r"jaas|password"


def spark_kafka_options(settings: KafkaConnectionSettings) -> dict[str, str]:
    """``kafka.*`` options for ``spark.readStream.format("kafka")``."""
    options = {
        "kafka.bootstrap.servers": ",".join(settings.kafka_bootstrap_servers),
        "kafka.security.protocol": settings.kafka_security_protocol,
    }
    mechanism = settings.kafka_sasl_mechanism
    if mechanism is not None:
        if mechanism not in _LOGIN_MODULES:
            raise ConfigurationError(
                f"OUTBOXKIT_KAFKA_SASL_MECHANISM={mechanism}: the Spark pipeline logs in with "
                "PLAIN or SCRAM only (an OAUTHBEARER token provider is Python code, which "
                "Spark's JVM Kafka client cannot call)"
            )
        username, password = settings.kafka_sasl_username, settings.kafka_sasl_password
        assert username is not None, "checked by the settings"
        assert password is not None, "checked by the settings"
        options["kafka.sasl.mechanism"] = mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[mechanism]} required "
            f"username={_quoted(username)} password={_quoted(password.get_secret_value())};"
        )
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        if settings.kafka_ssl_ca_file is not None:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = str(settings.kafka_ssl_ca_file)
        if settings.kafka_ssl_cert_file is not None and settings.kafka_ssl_key_file is not None:
            options["kafka.ssl.keystore.type"] = "PEM"
            options["kafka.ssl.keystore.location"] = str(
                _key_store(settings.kafka_ssl_cert_file, settings.kafka_ssl_key_file)
            )
            if settings.kafka_ssl_key_password is not None:
                options["kafka.ssl.key.password"] = (
                    settings.kafka_ssl_key_password.get_secret_value()
                )
        options["kafka.ssl.endpoint.identification.algorithm"] = (
            "https" if settings.kafka_ssl_check_hostname else ""
        )
    return options


def redact_in_plans(spark: SparkSession) -> None:
    """Make ``spark`` redact the Kafka login options in query plans and the UI."""
    key = "spark.sql.redaction.options.regex"
    current = spark.conf.get(key, "(?i)url")
    if REDACTED_OPTIONS not in (current or ""):
        spark.conf.set(key, f"{current}|(?i){REDACTED_OPTIONS}")


def _quoted(value: str) -> str:
    """A JAAS option value: double-quoted, with backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _key_store(cert_file: Path, key_file: Path) -> Path:
    """Kafka's PEM key store is one file holding the private key and the certificate chain:
    written once per process into a private directory (mode 0600)."""
    directory = Path(tempfile.mkdtemp(prefix="outboxkit-kafka-"))
    path = directory / "client.pem"
    path.write_text(key_file.read_text() + "\n" + cert_file.read_text())
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    return path
