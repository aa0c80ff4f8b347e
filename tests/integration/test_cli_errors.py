"""Errors a person can act on: every expected failure of the real `outboxkit` command (a
subprocess) ends with one or two lines on stderr that name what failed and say what to do, and a
non-zero exit code — never a traceback, unless asked for with --debug or
OUTBOXKIT_LOG_LEVEL=debug."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import pytest

from outboxkit.embedded import free_port
from tests.helpers import run_cli
from tests.integration.conftest import MakeTopic

pytestmark = pytest.mark.timeout(180)


@dataclass(frozen=True)
class Servers:
    pg: str
    empty_pg: str
    kafka: str
    topic: str
    closed: str  # 127.0.0.1:<a port nobody listens on>


@pytest.fixture
async def servers(
    pg_url: str, empty_pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> Servers:
    topic = await make_topic("orders", partitions=2)
    return Servers(pg_url, empty_pg_url, kafka_bootstrap, topic, f"127.0.0.1:{free_port()}")


def _with(
    url: str, *, user: str | None = None, host: str | None = None, db: str | None = None
) -> str:
    parts = urlsplit(url)
    netloc = f"{user or parts.username}@{host or f'{parts.hostname}:{parts.port}'}"
    return urlunsplit(parts._replace(netloc=netloc, path=f"/{db}" if db else parts.path))


def _fails(args: list[str], env: dict[str, str], code: int, *expected: str, lines: int = 2) -> str:
    result = run_cli(*args, env=env)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    stderr = result.stderr.strip()
    assert 1 <= len(stderr.splitlines()) <= lines, stderr
    for text in expected:
        assert text in stderr, stderr
    return stderr


#: Workers wait for an unreachable server during their start-up grace (test_startup_grace.py);
#: these tests ask for the verdict at once.
NO_GRACE = {"OUTBOXKIT_STARTUP_GRACE": "0"}


def test_unreachable_database(servers: Servers) -> None:
    url = _with(servers.pg, host=servers.closed)
    env = {
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka,
        **NO_GRACE,
    }
    expected = ("cannot connect to PostgreSQL at", servers.closed, "Is the server running")
    _fails(["relay", "--topics", servers.topic], env, 1, *expected)
    _fails(
        ["inbox", "dlq", "list", "--topics", servers.topic],
        env | {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.closed},
        1,
        "cannot reach Kafka",
    )
    _fails(["outbox", "pending"], env, 1, *expected)
    _fails(["migrate"], env, 1, *expected)
    _fails(["topics", "sync", "--topics", servers.topic], env, 1, *expected)


def test_unreachable_broker(servers: Servers) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": servers.pg,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.closed,
        **NO_GRACE,
    }
    expected = (f"cannot reach Kafka at {servers.closed}", "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS")
    _fails(["relay", "--topics", servers.topic], env, 1, *expected)
    _fails(["topics", "describe", "orders"], env, 1, "cannot reach Kafka")


def test_refused_login_and_missing_database(servers: Servers) -> None:
    env = {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka, "OUTBOXKIT_TOPICS": servers.topic}
    nobody = env | {"OUTBOXKIT_DATABASE_URL": _with(servers.pg, user="nobody")}
    _fails(["relay"], nobody, 1, "refused the login", 'role "nobody"', "user and password")
    nodb = env | {"OUTBOXKIT_DATABASE_URL": _with(servers.pg, db="no_such_db")}
    _fails(["relay"], nodb, 1, "no such database", "CREATE DATABASE")


def test_missing_tables(servers: Servers) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": servers.empty_pg,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka,
        "OUTBOXKIT_TOPICS": servers.topic,
    }
    for args in (["relay"], ["outbox", "pending"], ["outbox", "failed"]):
        _fails(args, env, 1, "outboxkit's schema does not exist", "outboxkit migrate")


def test_a_missing_topic_is_one_line_with_the_command_that_creates_it(servers: Servers) -> None:
    env = {"OUTBOXKIT_DATABASE_URL": servers.pg, "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka}
    line = _fails(
        ["relay", "--topics", "no-such-topic"],
        env,
        1,
        "no-such-topic",
        "`outboxkit topics create no-such-topic`",
        lines=1,
    )
    assert "OUTBOXKIT_: " not in line
    # A misspelt topic that resembles one that exists: said, rather than only the command that
    # would create a second topic.
    misspelt = servers.topic[:-1]
    expected = (
        f"topic {misspelt} not found on Kafka at {servers.kafka} (did you mean {servers.topic}?)"
    )
    _fails(["relay", "--topics", misspelt], env, 1, expected, lines=1)
    # The inbox needs the dead-letter topic too; the same command creates it.
    line = _fails(
        ["inbox", "tests.integration.inbox_app:inbox", "--topics", servers.topic],
        env,
        1,
        f"{servers.topic}.dlq",
        f"`outboxkit topics create {servers.topic}`",
        lines=1,
    )
    _fails(["topics", "describe", "no-such-topic"], env, 1, "outboxkit topics create", lines=1)


def test_every_invalid_or_missing_setting_at_once() -> None:
    stderr = _fails(
        ["relay"],
        {"OUTBOXKIT_SESSION_TIMEOUT": "soon", "OUTBOXKIT_LOG_FORMAT": "console"},
        2,
        "OUTBOXKIT_DATABASE_URL is not set",
        "OUTBOXKIT_TOPICS is not set",
        "OUTBOXKIT_SESSION_TIMEOUT: Input should be a valid number",
        lines=4,
    )
    assert "OUTBOXKIT_: " not in stderr
    _fails(
        ["relay"],
        {
            "OUTBOXKIT_DATABASE_URL": "mysql://h/db",
            "OUTBOXKIT_TOPICS": "orders",
            "OUTBOXKIT_SESSION_TIMEOUT": "3",
            "OUTBOXKIT_HEARTBEAT_INTERVAL": "2",
        },
        2,
        "OUTBOXKIT_DATABASE_URL: unsupported scheme 'mysql'",
        "OUTBOXKIT_HEARTBEAT_INTERVAL: must be at most a third of OUTBOXKIT_SESSION_TIMEOUT",
        lines=3,
    )


def test_debug_shows_the_traceback(servers: Servers) -> None:
    """As README says: --debug (anywhere) or OUTBOXKIT_LOG_LEVEL=debug adds the traceback to the
    same lines and exit code, also where a command turns the failure into its lines itself
    (#28: `outboxkit --debug migrate` against an unreachable database printed only the line)."""
    env = {
        "OUTBOXKIT_DATABASE_URL": _with(servers.pg, host=servers.closed),
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka,
        **NO_GRACE,
    }
    for args, extra in (
        (["outbox", "pending", "--debug"], {}),
        (["outbox", "pending"], {"OUTBOXKIT_LOG_LEVEL": "debug"}),
        (["--debug", "migrate"], {}),
        (["topics", "sync", "--topics", servers.topic, "--debug"], {}),
        (["relay", "status", "--topics", servers.topic, "--debug"], {}),
    ):
        plain = run_cli(*[a for a in args if a != "--debug"], env=env)
        assert "Traceback" not in plain.stderr, plain.stderr
        result = run_cli(*args, env=env | extra)
        assert result.returncode == plain.returncode != 0, (args, result.stderr)
        assert "Traceback" in result.stderr, (args, result.stderr)
        assert plain.stderr.splitlines()[0] in result.stderr.splitlines(), (args, result.stderr)
