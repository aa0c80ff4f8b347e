"""The demo on a MongoDB replica set of your own runs in a database of its own: the URL's
database is replaced, and the one that authenticates its user is kept."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from outboxkit.demo.servers import _keep_auth_source


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
