"""The demo on a MongoDB replica set of your own runs in a database of its own: the URL's
database is replaced, and the one that authenticates its user is kept. On the embedded mongod
it says where mongod comes from, and that it is fetched only when it is."""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from rich.console import Console

from outboxkit.demo.servers import _keep_auth_source, start_database
from outboxkit.embedded.mongodb import mongod_cache_dir


@pytest.mark.parametrize(
    ("url", "query"),
    [
        ("mongodb://h:1/shop?replicaSet=rs0", "replicaSet=rs0"),
        ("mongodb://u:p@h:1/shop?replicaSet=rs0", "replicaSet=rs0&authSource=shop"),
        ("mongodb://u:p@h:1/?replicaSet=rs0", "replicaSet=rs0&authSource=admin"),
        ("mongodb://u:p@h:1/shop?authsource=admin", "authsource=admin"),
        ("mongodb://u:p@h:1/shop", "authSource=shop"),
    ],
)
def test_the_user_authenticates_where_the_url_said(url: str, query: str) -> None:
    assert _keep_auth_source(urlsplit(url)) == query


class _Mongo:
    """The embedded mongod, not started: the demo's words before it are the subject."""

    address, pid = "127.0.0.1:1", None

    def __init__(self, workdir: Path, *, fetch: bool) -> None:
        pass

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def url(self, database: str) -> str:
        return f"mongodb://127.0.0.1:1/{database}?replicaSet=rs0"


def _demo_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr("outboxkit.demo.servers.EmbeddedMongo", _Mongo)
    console = Console(record=True, width=300)
    with contextlib.ExitStack() as stack:
        start_database("mongodb", tmp_path / "work", stack, console)
    return console.export_text()


def test_the_demo_says_mongod_is_fetched_only_when_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#44: "it is fetched … on first use" on every run, also with mongod in the cache."""
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    monkeypatch.delenv("OUTBOXKIT_MONGOD", raising=False)
    monkeypatch.delenv("OUTBOXKIT_DATABASE_URL", raising=False)
    first = _demo_says(tmp_path, monkeypatch)
    assert "SSPL" in first
    assert "fetching it into" in first
    cached = mongod_cache_dir() / "mongod"
    cached.parent.mkdir(parents=True)
    cached.touch()
    later = _demo_says(tmp_path, monkeypatch)
    assert "SSPL" in later
    assert f"running {cached}" in later
    assert "fetch" not in later
    assert "first use" not in later
