"""Settings: validated once, errors name the environment variable and say what to put there."""

from __future__ import annotations

import pytest

from outboxkit import ConfigurationError
from outboxkit.core.settings import ConnectionSettings, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DATABASE_URL",
        "KAFKA_BOOTSTRAP_SERVERS",
        "TOPICS",
        "CONNECT_TIMEOUT",
    ):
        monkeypatch.delenv(f"OUTBOXKIT_{name}", raising=False)


def test_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", "postgresql://u:p@db:5432/app")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS", "k1:9092, k2:9092")
    monkeypatch.setenv("OUTBOXKIT_TOPICS", "orders,payments,")
    settings = load_settings(ConnectionSettings)
    assert settings.kafka_bootstrap_servers == ["k1:9092", "k2:9092"]
    assert settings.topics == ["orders", "payments"]
    assert settings.database_kind == "postgresql"


def test_arguments_override_environment_and_none_means_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", "postgresql://env/app")
    settings = load_settings(
        ConnectionSettings, database_url="mongodb://h:27017/app?replicaSet=rs0", topics=None
    )
    assert settings.database_kind == "mongodb"
    assert settings.topics == []


def test_settings_are_frozen() -> None:
    settings = load_settings(ConnectionSettings, database_url="postgresql://h/app")
    with pytest.raises(ValueError, match="frozen"):
        settings.topics = ["x"]  # type: ignore[misc]


def test_missing_required_setting_says_what_to_set() -> None:
    with pytest.raises(ConfigurationError) as info:
        load_settings(ConnectionSettings)
    assert "OUTBOXKIT_DATABASE_URL is not set" in str(info.value)
    assert "postgresql://user:password@host:5432/dbname" in str(info.value)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"database_url": "mysql://h/app"}, "OUTBOXKIT_DATABASE_URL: unsupported scheme 'mysql'"),
        (
            {"database_url": "postgresql://h/a", "kafka_bootstrap_servers": "kafka"},
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS: 'kafka' is not host:port",
        ),
        (
            {"database_url": "postgresql://h/a", "connect_timeout": "0"},
            "OUTBOXKIT_CONNECT_TIMEOUT: Input should be greater than 0",
        ),
        ({"database_url": "postgresql://h/a", "colour": "blue"}, "colour: unknown setting"),
    ],
)
def test_invalid_values_are_named(values: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_settings(ConnectionSettings, **values)
    assert expected in str(info.value)
