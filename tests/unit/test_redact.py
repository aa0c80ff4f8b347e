"""redact(): a database URL shown without its secrets, read by the drivers' own parsers, in every
form each driver takes a password in; anything they cannot read unambiguously is <redacted>."""

from __future__ import annotations

from urllib.parse import quote, quote_plus

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from outboxkit.core.redact import MASK, REDACTED, redact, unreadable

#: RFC 3986's reserved characters, the percent sign, and the others URLs and shells trip on.
SPECIAL = ":/?#[]@!$&'()*+,;=%" + ' "\\<>^`{|}~'
PASSWORDS = st.text(st.sampled_from(SPECIAL) | st.characters(codec="utf-8"), min_size=1)


def _hidden(password: str, shown: str) -> bool:
    forms = {password, quote(password, safe=""), quote_plus(password)}
    return not any(form in shown for form in forms)


def _quoted(value: str) -> str:
    """A value for libpq's key='value' form."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _postgresql_forms(password: str) -> list[str]:
    encoded = quote(password, safe="")
    return [
        f"postgresql://app:{encoded}@db.example:5432/shop",
        f"postgres://app:{encoded}@h1.example:5432,h2.example:5433/shop?sslmode=require",
        f"postgresql://app@db.example/shop?password={encoded}&application_name=orders",
        f"postgresql:///shop?host=/var/run/postgresql&password={encoded}",
        f"postgresql://app:{password}@db.example:5432/shop",  # as typed
        f"host=db.example user=app password='{_quoted(password)}' dbname=shop",
        f"postgresql://app@db.example/shop?sslpassword={encoded}",
    ]


def _mongodb_forms(password: str) -> list[str]:
    encoded = quote_plus(password)
    return [
        f"mongodb://app:{encoded}@m1.example:27017,m2.example:27018,m3.example/shop"
        "?replicaSet=rs0&authSource=admin",
        f"mongodb+srv://app:{encoded}@cluster0.example.net/shop?retryWrites=true",
        f"mongodb://app:{quote(password, safe='')}@m1.example/shop?authSource=admin",
        f"mongodb://app:{password}@m1.example/shop",  # as typed
        f"mongodb://m1.example/shop?tlsCertificateKeyFilePassword={encoded}&tls=true",
        f"mongodb://m1.example/shop?authMechanism=MONGODB-AWS"
        f"&authMechanismProperties=AWS_SESSION_TOKEN:{encoded}",
    ]


@given(PASSWORDS)
def test_no_form_of_a_password_is_shown(password: str) -> None:
    # Not a piece of what is shown anyway (a host name, a scheme, a default port) by chance.
    others = [*_postgresql_forms("x"), *_mongodb_forms("x")]
    rest = " ".join([*others, *map(redact, others), REDACTED])
    assume(len(password) >= 3 and password not in rest)
    for url in [*_postgresql_forms(password), *_mongodb_forms(password)]:
        shown = redact(url)
        assert _hidden(password, shown), (url, shown)
        assert shown == REDACTED or MASK in shown, (url, shown)
        # Refused for a reason that does not quote it either.
        assert _hidden(password, unreadable(url) or ""), url


@given(PASSWORDS.filter(lambda password: "\x00" not in password))  # libpq reads C strings
def test_a_url_the_driver_reads_is_shown_with_the_same_parameters(password: str) -> None:
    where = "h1.example:5432,h2.example/shop?sslmode=require"
    url = f"postgres://app:{quote(password, safe='')}@{where}"
    shown = redact(url)
    assert shown == f"postgres://app:***@{where}"
    assert {**conninfo_to_dict(url), "password": MASK} == conninfo_to_dict(shown)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:S3CR#ET@db:5432/shop", "postgresql://app:***@db:5432/shop"),
        ("postgresql://app:a?b:c@db/shop", "postgresql://app:***@db/shop"),
        (
            "postgresql://app@db/shop?password=S3CR%26ET&sslmode=disable",
            "postgresql://app:***@db/shop?sslmode=disable",
        ),
        ("postgresql://app:S3%2FCR%2FET@[::1]:5432/shop", "postgresql://app:***@[::1]:5432/shop"),
        ("postgresql://db/shop", "postgresql://db/shop"),
        (
            "host=db port=5432 user=app password='se cr\\'et' dbname=shop",
            "user=app password=*** dbname=shop host=db port=5432",
        ),
        (
            "mongodb://app:p%40ss@m1:27017,m2:27018/shop?replicaSet=rs0&authSource=admin",
            "mongodb://app:***@m1:27017,m2:27018/shop?replicaSet=rs0&authSource=admin",
        ),
        ("mongodb://app:S3CR#ET@m1/shop", "mongodb://app:***@m1:27017/shop"),
        (
            "mongodb+srv://app:pw@cluster0.example.net/shop?retryWrites=true",
            "mongodb+srv://app:***@cluster0.example.net/shop?retryWrites=true",
        ),
        (
            "mongodb://127.0.0.1:27017/shop?replicaSet=rs0",
            "mongodb://127.0.0.1:27017/shop?replicaSet=rs0",
        ),
        ("memory://tests", "memory://tests"),
    ],
)
def test_what_is_shown(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert unreadable(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:S3/CRET@db:5432/shop",  # libpq: host "app", port "S3"
        "postgresql://app:S3@CRET@db:5432/shop",  # libpq: password "S3", host "CRET@db"
        "postgresql://app:50%@db/shop",  # not a percent-encoding
        "postgresql://app:p w@db/shop",  # libpq's error would quote "p w"
        "host=db password='unterminated",
        "mongodb://app:12/S3CRET@m1",  # pymongo: host "app", port 12, database "S3CRET@m1"
        "mongodb://app:a:b@m1/shop",
        "mongodb://app:S3?CRET@m1/shop",
        "mysql://app:S3CRET@db/shop",
        "memory://app:S3CRET@x",
        "S3CRET",
        "",
    ],
)
def test_what_the_driver_cannot_read_as_written_is_redacted_whole(url: str) -> None:
    assert redact(url) == REDACTED
    reason = unreadable(url)
    assert reason is not None
    assert "S3" not in reason
    assert "CRET" not in reason
