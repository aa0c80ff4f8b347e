"""One wording for a login a server refused, whichever server it is (PostgreSQL, MongoDB, Kafka's
SASL): the configuration is wrong, and no wait will fix it, so a worker's start-up grace (which
waits for a server that does not answer) never waits for it."""

from __future__ import annotations


def refused_login(server: str, user: str | None, check: str, reason: str) -> str:
    """``<server> refused the login for user <user>: check <check> (<reason>)``, one line; the
    password is never part of it."""
    who = f" for user {user}" if user else ""
    return f"{server} refused the login{who}: check {check} ({reason})"
