"""No password reaches an operator's screen (issue #26, item 4; DESIGN §5, "Secrets"): whatever
its characters and however the URL carries it, `outboxkit check`, `migrate`, `relay status` and
`outbox pending` — against a database that is not there and one that is, PostgreSQL and MongoDB
— print and log the URL with its password masked, or not at all; a relay's logs, health body
and metrics, and outboxkit's exception texts, never show it either."""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import logging
import os
import traceback
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from unittest import mock
from urllib.parse import quote, quote_plus, urlsplit

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.uri_parser import parse_uri

from outboxkit.cli import main
from outboxkit.core.settings import ConnectionSettings
from outboxkit.embedded import free_port
from outboxkit.embedded.postgres import EmbeddedPostgres
from outboxkit.relay import RelaySettings
from tests.helpers import http_client, run_cli, wait_for
from tests.integration.conftest import MakeTopic, migrate_database
from tests.integration.relay_harness import RelayProcess, register_topic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: RFC 3986's reserved characters, the percent sign, and the others URLs and shells trip on.
SPECIAL = ":/?#[]@!$&'()*+,;=%" + ' "\\<>^`{|}~'
_FILLER = st.text("abcXYZ019é", max_size=3)


@st.composite
def passwords(draw: st.DrawFn) -> str:
    """A password with every character of :data:`SPECIAL` once, in any order, among letters
    and digits (never a substring of anything else a command prints: 30 characters at least)."""
    specials = draw(st.permutations(SPECIAL))
    filler = draw(st.lists(_FILLER, min_size=len(SPECIAL) + 1, max_size=len(SPECIAL) + 1))
    return filler[0] + "".join(s + f for s, f in zip(specials, filler[1:], strict=True))


def _forms(password: str) -> list[str]:
    """What must not be shown: the password, and the encodings a URL carries it in."""
    return sorted({password, quote(password, safe=""), quote_plus(password)})


def _leaks(password: str, text: str) -> list[str]:
    return [form for form in _forms(password) if form in text]


# -- URLs ---------------------------------------------------------------------------------------


def _postgresql_urls(server: str, password: str) -> list[str]:
    """``server`` (``postgresql://user@host:port/db``) with ``password`` in every form libpq
    takes in a URL: percent-encoded user info, a ``password`` parameter, and as typed."""
    parts = urlsplit(server)
    user, where = parts.username, f"{parts.hostname}:{parts.port}{parts.path}"
    return [
        f"postgresql://{user}:{quote(password, safe='')}@{where}",
        f"postgresql://{user}@{where}?password={quote(password, safe='')}&sslmode=disable",
        f"postgresql://{user}:{password}@{where}",
    ]


def _mongodb_urls(server: str, database: str, user: str, password: str) -> list[str]:
    """MongoDB URLs with ``password``: encoded, with several hosts (one of them down) and
    ``authSource``; and as typed."""
    host = urlsplit(server).netloc
    down = f"127.0.0.1:{free_port()}"
    return [
        f"mongodb://{user}:{quote_plus(password)}@{host},{down}/{database}"
        f"?replicaSet=rs0&authSource={database}",
        f"mongodb://{user}:{password}@{host}/{database}?replicaSet=rs0",
    ]


def _read_as_typed(url: str, password: str) -> bool:
    """Whether the driver reads ``password`` from ``url`` (then the login succeeds)."""
    try:
        if url.startswith("mongodb"):
            return bool(parse_uri(url)["password"] == password)
        return bool(conninfo_to_dict(url).get("password") == password)
    except (PyMongoError, psycopg.Error, ValueError):
        return False


# -- running the command in this process --------------------------------------------------------


class _Records(logging.Handler):
    """Every log record, as a handler would write it (traceback included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(logging.Formatter().format(record))


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``outboxkit *args`` in this process: its exit code and all it printed or logged, and the
    text of any exception that escaped it."""
    out, records = io.StringIO(), _Records()
    root = logging.getLogger()
    root.addHandler(records)
    level = root.level
    root.setLevel(logging.DEBUG)  # the drivers' debug logs too
    code: int = 0
    try:
        with (
            mock.patch.dict(os.environ, env),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(out),
            # The command runs as if it were its own process, which ends right after: a socket
            # pymongo's monitor opens while its client closes is not this test's concern.
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", ResourceWarning)
            # The collection looks at the command's objects only, not at the whole test
            # session's (35 ms a command): what existed before is frozen meanwhile.
            gc.freeze()
            try:
                main(args)
            finally:
                gc.collect()
                gc.unfreeze()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # a bug; its text must not leak the password either
        out.write("".join(traceback.format_exception(exc)))
        code = -1
    finally:
        root.removeHandler(records)
        root.setLevel(level)
    return code, out.getvalue() + "\n".join(records.lines)


COMMANDS = [["check"], ["migrate"], ["relay", "status"], ["outbox", "pending"]]


@dataclass
class Servers:
    pg: str  # a migrated database
    mongo: str  # the replica set, no database
    kafka: str
    topic: str


@pytest.fixture
async def servers(
    pg_url: str, mongo_server_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> Servers:
    return Servers(pg_url, mongo_server_url, kafka_bootstrap, await make_topic("orders"))


@contextlib.contextmanager
def _mongodb_user(server: str, database: str, user: str, password: str) -> Iterator[None]:
    """A user of ``database`` whose password is ``password`` (MongoDB checks it even without
    --auth when a client logs in)."""
    client: MongoClient[dict[str, object]] = MongoClient(server)
    try:
        client[database].command("createUser", user, pwd=password, roles=["dbOwner"])
        yield
        client[database].command("dropUser", user)
        client.drop_database(database)
    finally:
        client.close()


_examples = itertools.count()


@settings(
    # Each example runs 4 commands against about ten URLs (3 s an example, none waiting more
    # than the 1 s connect timeout on a dead server): 2 random passwords and the explicit one
    # here; tests/unit/test_redact.py's property tries hundreds against the redaction itself.
    max_examples=2,
    deadline=None,
    # The servers are the same for every example on purpose: starting them is the slow part.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(password=passwords())
@example(password="S3CR#ET?:!")  # what libpq reads as typed: accepted, and masked
def test_no_command_shows_the_password(servers: Servers, password: str) -> None:
    n = next(_examples)
    dead = f"127.0.0.1:{free_port()}"
    pg_dead = servers.pg.replace(urlsplit(servers.pg).netloc.split("@")[-1], dead)
    mongo_dead = f"mongodb://{dead}/?replicaSet=rs0"
    database, user = f"secrets_{n}_{os.getpid()}", f"app{n}"
    urls = [
        *_postgresql_urls(servers.pg, password),
        *_postgresql_urls(pg_dead, password),
        *_mongodb_urls(servers.mongo, database, user, password),
        *_mongodb_urls(mongo_dead, database, user, password),
    ]
    with _mongodb_user(servers.mongo, database, user, password):
        for url, command in itertools.product(urls, COMMANDS):
            env = {
                "OUTBOXKIT_DATABASE_URL": url,
                "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka,
                "OUTBOXKIT_TOPICS": servers.topic,
                "OUTBOXKIT_RELAY_NAME": "secrets",
                "OUTBOXKIT_CONNECT_TIMEOUT": "1" if dead in url else "10",
            }
            code, shown = _run(command, env)
            assert code in (0, 1, 2), (command, shown)
            assert not _leaks(password, shown), (command, shown)
            if command == ["check"] and dead not in url and _read_as_typed(url, password):
                assert "ok   database" in shown, shown  # logged in: the password was right


def test_a_reachable_database_is_named_with_its_password_masked(servers: Servers) -> None:
    url = _postgresql_urls(servers.pg, "S3CR#ET")[0]
    code, shown = _run(["check"], {"OUTBOXKIT_DATABASE_URL": url, **_kafka(servers)})
    assert code == 0, shown
    assert f"at {url.replace(quote('S3CR#ET', safe=''), '***')}" in shown


def _kafka(servers: Servers) -> dict[str, str]:
    return {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": servers.kafka, "OUTBOXKIT_TOPICS": servers.topic}


# -- the forms of issue #26, through the real command -------------------------------------------


@pytest.mark.parametrize(
    ("password", "url"),
    [
        ("S3CR#ET", "postgresql://app:S3CR#ET@{dead}/app"),
        ("S3CR&ET", "postgresql://app@{dead}/app?password=S3CR%26ET"),
        ("S3/CR/ET", "postgresql://app:S3%2FCR%2FET@{dead}/app"),
        ("S3/CRET", "postgresql://app:S3/CRET@{dead}/app"),
        ("S3CR@ET", "mongodb://app:S3CR%40ET@{dead},{dead2}/app?replicaSet=rs0&authSource=admin"),
    ],
    ids=["hash", "password-parameter", "encoded-slash", "slash", "mongodb-hosts-authsource"],
)
def test_the_passwords_of_issue_26_are_not_printed(
    kafka_bootstrap: str, password: str, url: str
) -> None:
    url = url.format(dead=f"127.0.0.1:{free_port()}", dead2=f"127.0.0.1:{free_port()}")
    env = {
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_CONNECT_TIMEOUT": "1",
    }
    # Each command is a process of its own: all four at once.
    with ThreadPoolExecutor(len(COMMANDS)) as pool:
        results = list(pool.map(lambda command: run_cli(*command, env=env), COMMANDS))
    for command, result in zip(COMMANDS, results, strict=True):
        assert result.returncode in (1, 2), (command, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        assert not _leaks(password, result.stdout + result.stderr), (command, result)


# -- settings and exceptions ----------------------------------------------------------------------


@given(password=passwords())
def test_settings_and_their_errors_do_not_show_the_password(password: str) -> None:
    url = f"postgresql://app:{quote(password, safe='')}@db.example:5432/app"
    loaded = ConnectionSettings(database_url=url)
    assert not _leaks(password, repr(loaded) + str(loaded))
    assert "postgresql://app:***@db.example:5432/app" in repr(loaded)
    with pytest.raises(ValidationError) as invalid:
        RelaySettings(database_url=url, topics=["orders"], session_timeout="soon")
    assert not _leaks(password, str(invalid.value) + repr(invalid.value))
    # Typed as is, the password's reserved characters make the driver misread the URL: refused
    # before any driver sees it (their errors quote what they could not read), without quoting it.
    with pytest.raises(ValidationError) as misread:
        ConnectionSettings(database_url=f"postgresql://app:{password}@db.example:5432/app")
    assert "percent-encode" in str(misread.value)
    assert not _leaks(password, str(misread.value))


# -- a relay: logs, health, metrics ---------------------------------------------------------------


async def _get(port: int, path: str) -> str:
    async with http_client(base_url=f"http://127.0.0.1:{port}") as http:
        return (await http.get(path, timeout=5)).text


async def _healthy(port: int) -> bool:
    try:
        async with http_client(base_url=f"http://127.0.0.1:{port}") as http:
            return (await http.get("/healthz", timeout=5)).status_code == 200
    except (httpx.HTTPError, OSError):
        return False


async def _erred(port: int) -> bool:
    async with http_client(base_url=f"http://127.0.0.1:{port}") as http:
        return (await http.get("/healthz", timeout=5)).json()["last_error"] is not None


@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(password=passwords())
async def test_a_relay_shows_no_password_in_logs_health_or_metrics(
    pg_factory: Callable[[], EmbeddedPostgres],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    password: str,
) -> None:
    topic = await make_topic("secrets")
    pg = pg_factory()
    await migrate_database(pg.url())
    await register_topic(pg.url(), topic, 1)
    url = _postgresql_urls(pg.url(), password)[0]
    port = free_port()
    relay = RelayProcess(
        tmp_path,
        {
            "OUTBOXKIT_DATABASE_URL": url,
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "OUTBOXKIT_TOPICS": topic,
            "OUTBOXKIT_RELAY_NAME": f"secrets-{port}",
            "OUTBOXKIT_HTTP_PORT": str(port),
            "OUTBOXKIT_LOG_LEVEL": "debug",
            "OUTBOXKIT_LOG_FORMAT": "json",
            # Its database stopped, the relay reports the error once a connection is refused
            # for this long (10 s by default), and stops within the revoke timeout (20 s).
            "OUTBOXKIT_CONNECT_TIMEOUT": "2",
            "OUTBOXKIT_REVOKE_TIMEOUT": "2",
        },
    ).start()
    shown: list[str] = []
    try:
        await wait_for(lambda: _healthy(port), within=60, what="a healthy relay")
        shown += [await _get(port, "/healthz"), await _get(port, "/metrics")]
        pg.stop("immediate")  # the relay's connections fail: their errors reach health and logs
        await wait_for(lambda: _erred(port), within=60, what="the relay to see it")
        shown += [await _get(port, "/healthz"), await _get(port, "/metrics")]
    finally:
        with contextlib.suppress(Exception):
            relay.terminate()
        relay.kill()
        pg.close()
    assert "PostgreSQL is unavailable" in shown[2], shown[2]  # the driver's error, in the body
    assert not _leaks(password, "\n".join([*shown, relay.log()]))
