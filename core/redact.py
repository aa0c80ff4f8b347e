"""Database URLs as they may be shown: secrets masked, read the way the database's driver reads
them (DESIGN §5, "Secrets").

:func:`redact` parses a URL with its driver's own parser — libpq's (``psycopg.conninfo``) for
``postgresql://`` URLs and ``key=value`` connection strings, pymongo's for ``mongodb://`` and
``mongodb+srv://`` — and rebuilds it from what the driver read, with every secret replaced by
:data:`MASK`: the password wherever it was given (user info, percent-encoded or not, or a
``password=`` parameter), and the other secrets a driver takes (``sslpassword``; MongoDB's
``tlsCertificateKeyFilePassword`` and ``authMechanismProperties``, which may carry a cloud
session token). Nothing of the text as written is copied through, so a password the driver
reads differently from how it was meant cannot slip out either.

It fails closed: a URL the driver cannot parse, or reads other than it is written (a reserved
character of a password left unencoded, so that part of the password lands in the host, port
or database name), is shown as :data:`REDACTED`, never as the input. :func:`unreadable` says
why such a URL is refused, without quoting it; the settings refuse it before any driver sees
it, since a driver's own error would quote the piece it could not read.

The drivers are imported when a URL of theirs is redacted: the foundation imports no driver
it does not need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

#: What a secret is shown as.
MASK = "***"
#: What a URL that cannot be read safely is shown as, whole.
REDACTED = "<redacted>"

_POSTGRESQL_SCHEMES = ("postgresql", "postgres")
_MONGODB_SCHEMES = ("mongodb", "mongodb+srv")
#: libpq's parameters that hold secrets.
_POSTGRESQL_SECRETS = frozenset({"password", "sslpassword"})
#: MongoDB URI options that hold secrets (lower case: option names are case-insensitive).
_MONGODB_SECRETS = frozenset(
    {"tlscertificatekeyfilepassword", "sslpemkeypassword", "authmechanismproperties"}
)

_ENCODE = (
    "percent-encode the reserved characters of the user name and password (@ as %40, / as "
    "%2F, : as %3A, ? as %3F, # as %23, % as %25, a space as %20), e.g. with "
    "urllib.parse.quote(password, safe='')"
)


class _UnreadableURLError(ValueError):
    """The driver cannot parse the URL, or reads it other than it is written."""


def redact(url: str) -> str:
    """``url`` with its secrets masked, as its driver reads it; :data:`REDACTED` when the
    driver cannot read it unambiguously, or for anything that is not a database URL. Never
    raises."""
    try:
        return _redact(url)
    except Exception:
        return REDACTED


def unreadable(url: str) -> str | None:
    """Why the driver of ``url`` cannot read it as written (never quoting it), or ``None``."""
    try:
        _redact(url)
    except _UnreadableURLError as exc:
        return str(exc)
    except Exception:
        return f"the driver cannot read this URL: {_ENCODE}"
    return None


def _redact(url: str) -> str:
    if "\x00" in url:  # libpq reads a C string: it would stop there, mid-password maybe
        raise _UnreadableURLError("a database URL cannot hold a NUL character")
    scheme, separator, _ = url.partition("://")
    if not separator:
        if "=" in url:  # libpq's key=value form: host=… user=… password=…
            return _postgresql_conninfo(url)
        raise _UnreadableURLError("not a database URL")
    if scheme in _POSTGRESQL_SCHEMES:
        return _postgresql_url(url, scheme)
    if scheme in _MONGODB_SCHEMES:
        return _mongodb_url(url, scheme)
    if scheme == "memory" and "@" not in url:  # tests only: a name, never credentials
        return url
    raise _UnreadableURLError(f"unsupported scheme {scheme!r}")


# -- PostgreSQL -------------------------------------------------------------------------------


def _postgresql_params(conninfo: str) -> dict[str, str]:
    """What libpq reads from ``conninfo`` (a URL or key=value pairs)."""
    from psycopg import ProgrammingError  # noqa: PLC0415 - only when redacting a PostgreSQL URL
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    try:
        params = {name: str(value) for name, value in conninfo_to_dict(conninfo).items()}
    except ProgrammingError:
        # libpq's message quotes the token it could not read: part of the password, maybe.
        raise _UnreadableURLError(
            f"the PostgreSQL driver cannot read this URL: {_ENCODE}"
        ) from None
    _check_read_as_written(
        "PostgreSQL",
        {k: v for k, v in params.items() if k != "user" and k not in _POSTGRESQL_SECRETS},
    )
    if not all(port.isdigit() for port in params.get("port", "").split(",") if port):
        raise _UnreadableURLError(
            f"the PostgreSQL driver reads part of this URL as a port that is not a number: "
            f"{_ENCODE}"
        )
    return params


def _check_read_as_written(database: str, fields: Mapping[str, object]) -> None:
    """An ``@`` in anything but the user name means the driver split the URL elsewhere than
    its user info ends: a password with ``/`` or ``@`` unencoded, read as host or database."""
    if any("@" in str(value) for value in fields.values()):
        raise _UnreadableURLError(
            f"the {database} driver reads part of the user name or password of this URL as its "
            f"host, port, database or options: {_ENCODE}"
        )


def _postgresql_url(url: str, scheme: str) -> str:
    params = _postgresql_params(url)
    user = params.pop("user", None)
    password = params.pop("password", None)
    userinfo = ""
    if user is not None or password is not None:
        userinfo = quote(user or "", safe="") + (f":{MASK}" if password is not None else "") + "@"
    hosts = params.pop("host", "")
    ports = params.pop("port", "")
    netloc = _postgresql_netloc(hosts, ports)
    if netloc is None:  # Unix-domain socket directories: as parameters, as libpq allows
        params = {"host": hosts, **({"port": ports} if ports else {}), **params}
        netloc = ""
    path = "/" + quote(params.pop("dbname"), safe="") if "dbname" in params else ""
    query = "&".join(
        f"{quote(name, safe='')}={MASK if name in _POSTGRESQL_SECRETS else quote(value, safe='')}"
        for name, value in params.items()
    )
    return f"{scheme}://{userinfo}{netloc}{path}" + (f"?{query}" if query else "")


def _postgresql_netloc(hosts: str, ports: str) -> str | None:
    """``host:port`` pairs (libpq's lists are comma-separated; one port serves every host), or
    ``None`` when a host is a socket directory, which has no place in a URL's authority."""
    names = hosts.split(",") if hosts else []
    numbers = ports.split(",") if ports else []
    if any(name.startswith("/") for name in names):
        return None
    if len(numbers) == 1:
        numbers = numbers * len(names)
    pairs = []
    for i, name in enumerate(names):
        host = f"[{name}]" if ":" in name else quote(name, safe=".-_~")
        port = numbers[i] if i < len(numbers) and numbers[i] else ""
        pairs.append(f"{host}:{port}" if port else host)
    return ",".join(pairs)


def _postgresql_conninfo(conninfo: str) -> str:
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    params = _postgresql_params(conninfo)
    return make_conninfo(
        "", **{k: MASK if k in _POSTGRESQL_SECRETS else v for k, v in params.items()}
    )


# -- MongoDB ----------------------------------------------------------------------------------


def _mongodb_url(url: str, scheme: str) -> str:
    from outboxkit.core.mongodb import parse_url  # noqa: PLC0415 - imports pymongo

    try:
        parsed = parse_url(url)
    except Exception:
        # pymongo's messages say what is wrong without quoting the URL; ours does too.
        raise _UnreadableURLError(f"the MongoDB driver cannot read this URL: {_ENCODE}") from None
    options: Mapping[str, Any] = parsed["options"]
    cased: Callable[[str], str] = getattr(options, "cased_key", lambda key: key)
    plain = {k: v for k, v in options.items() if k.lower() not in _MONGODB_SECRETS}
    _check_read_as_written(
        "MongoDB",
        {
            "hosts": parsed["nodelist"],
            "database": parsed["database"],
            "collection": parsed["collection"],
            **plain,
        },
    )
    user, password = parsed["username"], parsed["password"]
    userinfo = ""
    if user is not None:
        userinfo = quote_plus(user) + (f":{MASK}" if password else "") + "@"
    hosts = ",".join(_mongodb_host(host, port) for host, port in parsed["nodelist"])
    path = ""
    if parsed["database"] is not None:
        path = "/" + quote_plus(parsed["database"])
        if parsed["collection"] is not None:
            path += "." + quote_plus(parsed["collection"])
    query = "&".join(
        f"{cased(name)}={_mongodb_option(name, value)}"
        for name, values in options.items()
        for value in (values if isinstance(values, list) else [values])
    )
    return f"{scheme}://{userinfo}{hosts}{path or ('/' if query else '')}" + (
        f"?{query}" if query else ""
    )


def _mongodb_host(host: str, port: int | None) -> str:
    if host.endswith(".sock"):
        return quote_plus(host)
    name = f"[{host}]" if ":" in host else host
    return f"{name}:{port}" if port is not None else name


def _mongodb_option(name: str, value: object) -> str:
    if name.lower() in _MONGODB_SECRETS:
        return MASK
    return quote_plus(str(value), safe=":,")
