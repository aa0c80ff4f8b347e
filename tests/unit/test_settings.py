"""Settings: validated once, errors name the environment variable and say what to put there."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings

from outboxkit import ConfigurationError
from outboxkit.core.settings import ConnectionSettings, load_settings
from outboxkit.relay import RelaySettings


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


def _settings_fields() -> list[tuple[type[BaseSettings], str]]:
    from outboxkit.variables import SETTINGS, load  # noqa: PLC0415

    classes = [load(target) for target in SETTINGS]
    return [(cls, name) for cls in classes for name in cls.model_fields]


@pytest.mark.parametrize("value", ["notjson", "{'linger_ms': 5}", "[1"])
@pytest.mark.parametrize(
    ("cls", "field"), _settings_fields(), ids=lambda p: p if isinstance(p, str) else p.__name__
)
def test_no_setting_value_stops_the_load_without_naming_its_variable(
    cls: type[BaseSettings], field: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#44: OUTBOXKIT_KAFKA_CLIENT_OPTIONS=notjson was `unexpected SettingsError … report it`
    (pydantic-settings decodes JSON settings before validation, and stops the whole load).
    Every setting, whatever text its variable holds, loads or is a ConfigurationError naming
    it (or, for a check across settings, the group it belongs to) — so a setting parsed from
    JSON must be a JsonObject (or NoDecode)."""
    required = {
        "OUTBOXKIT_DATABASE_URL": "postgresql://h/db",
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_PIPELINE_OUTPUT": "/tmp/lake",
    }
    for name, default in required.items():
        monkeypatch.setenv(name, default)
    variable = f"OUTBOXKIT_{field.upper()}"
    monkeypatch.setenv(variable, value)
    try:
        load_settings(cls)
    except ConfigurationError as exc:
        message = str(exc)
    else:
        return
    assert variable in message or "OUTBOXKIT_KAFKA_SASL_*" in message, message


@pytest.mark.parametrize("value", ["notjson", "{'linger_ms': 5}", "[1, 2]"])
def test_a_malformed_json_setting_says_how_to_write_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_KAFKA_CLIENT_OPTIONS", value)
    monkeypatch.setenv("OUTBOXKIT_SESSION_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError) as raised:
        load_settings(RelaySettings, database_url="postgresql://h/db", topics="orders")
    message = str(raised.value)
    assert "OUTBOXKIT_KAFKA_CLIENT_OPTIONS: " in message
    assert "JSON object" in message
    assert "OUTBOXKIT_SESSION_TIMEOUT" in message  # named with the other invalid settings
