"""The console's parts that need no server: what a page may show of a payload, logins and CSRF
tokens, the chart's scale, its settings and the pages' headers (the whole console against real
servers and a browser: tests/integration/test_console.py)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated

import pytest
import structlog
from fastapi import FastAPI, Header, HTTPException
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr
from starlette.requests import Request
from starlette.testclient import TestClient

from outboxkit.backends import forget_memory_database, memory_database
from outboxkit.console import ConsoleSettings, console, security
from outboxkit.console.chart import chart
from outboxkit.console.overview import Sample
from outboxkit.console.payloads import MASK, show_payload
from outboxkit.console.security import (
    CSRF_COOKIE,
    LOGIN_FAILURES,
    LOGIN_WINDOW,
    SESSION_COOKIE,
    Guard,
    LoginThrottle,
    Refused,
)
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import ConnectionSettings
from outboxkit.relay import TopicPartition
from outboxkit.service import Outboxkit
from tests.integration.relay_harness import Step

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="abc", max_size=8),
    lambda inner: (
        # Keys that can be neither the mask nor a sensitive name: the count below is the test's.
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet="abc_", max_size=6), inner, max_size=3)
    ),
    max_leaves=20,
)


@given(value=json_values, secret=st.text(min_size=1, max_size=12).map(lambda s: f"SECRET-{s}"))
def test_a_sensitive_field_is_never_shown_at_any_depth(value: object, secret: str) -> None:
    payload = {"outer": [value, {"Card_Number": secret}], "card_number": secret}
    shown = show_payload(json.dumps(payload).encode(), sensitive=["card_number"], limit=1_000_000)
    assert "SECRET-" not in shown
    assert shown.count(MASK) == 2


def test_a_long_payload_is_cut_and_says_how_much_is_left_out() -> None:
    shown = show_payload(json.dumps({"blob": "x" * 5000}).encode(), sensitive=[], limit=100)
    assert shown.endswith("more characters)")
    assert len(shown) < 200


def test_bytes_that_are_not_json_are_hidden_when_fields_are_sensitive() -> None:
    assert "hidden" in show_payload(b"\x00card=4111", sensitive=["card"], limit=100)
    assert show_payload(b"plain\x1b[2J", sensitive=[], limit=100) == "plain\\x1b[2J"


def _request(cookies: dict[str, str], headers: dict[str, str] | None = None) -> Request:
    raw = [(b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request(
        {
            "type": "http",
            "headers": raw,
            "scheme": "http",
            "server": ("h", 80),
            "path": "/",
            "method": "POST",
            "query_string": b"",
            "root_path": "",
        }
    )


def test_a_session_lasts_its_ttl_and_ends_when_the_token_changes() -> None:
    guard = Guard.create(SecretStr("t" * 24), SecretStr("key"), session_ttl=60)
    session = guard.new_session()
    assert guard.principal(_request({SESSION_COOKIE: session})) == "session"
    tampered = session[:-1] + ("1" if session.endswith("0") else "0")
    with pytest.raises(Refused):
        guard.principal(_request({SESSION_COOKIE: tampered}))
    expired = Guard.create(SecretStr("t" * 24), SecretStr("key"), session_ttl=-1).new_session()
    with pytest.raises(Refused):
        guard.principal(_request({SESSION_COOKIE: expired}))
    other_token = Guard.create(SecretStr("u" * 24), SecretStr("key"), session_ttl=60)
    with pytest.raises(Refused):
        other_token.principal(_request({SESSION_COOKIE: session}))
    assert guard.principal(_request({}, {"authorization": "Bearer " + "t" * 24})) == "bearer"


def test_a_csrf_token_must_be_signed_and_match_the_cookie() -> None:
    guard = Guard.create(None, SecretStr("key"), session_ttl=60)
    nonce, new = guard.csrf_nonce(_request({}))
    assert new
    token = guard.csrf_token(nonce)
    guard.check_csrf(_request({CSRF_COOKIE: nonce}), {"csrf": [token]})
    other, _ = guard.csrf_nonce(_request({}))
    for cookies, form in [
        ({CSRF_COOKIE: nonce}, {}),  # missing
        ({}, {"csrf": [token]}),  # no cookie
        ({CSRF_COOKIE: other}, {"csrf": [token]}),  # another browser's
        ({CSRF_COOKIE: nonce}, {"csrf": [f"{nonce}.{'0' * 64}"]}),  # forged
    ]:
        with pytest.raises(Refused) as refused:
            guard.check_csrf(_request(cookies), form)
        assert refused.value.status == 403
    with pytest.raises(Refused):
        guard.check_csrf(
            _request({CSRF_COOKIE: nonce}, {"origin": "https://elsewhere.example"}),
            {"csrf": [token]},
        )


attempts = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=20, allow_nan=False),  # seconds since the last one
        st.sampled_from(["10.0.0.1", "10.0.0.2", None]),
        st.booleans(),  # the right token
    ),
    max_size=80,
)


@given(attempts=attempts)
def test_a_client_is_refused_logins_while_it_gave_too_many_wrong_tokens(
    attempts: list[tuple[float, str | None, bool]],
) -> None:
    """Against a model: a login is refused, unchecked, exactly while its client gave
    LOGIN_FAILURES wrong tokens within the last LOGIN_WINDOW seconds, others never; its
    Retry-After is the first moment it may try again."""
    now = 0.0
    throttle = LoginThrottle(failures=4, window=30, clock=lambda: now)
    failed: dict[str | None, list[float]] = {}
    for wait, client, right in attempts:
        now += wait
        recent = [at for at in failed.get(client, []) if at > now - 30]
        if len(recent) >= 4:
            with pytest.raises(Refused) as refused:
                throttle.check(client)
            assert refused.value.status == 429
            assert refused.value.retry_after is not None
            assert recent[0] + 30 <= now + refused.value.retry_after < recent[0] + 31
            continue
        throttle.check(client)
        if not right:
            throttle.failed(client)
            failed.setdefault(client, []).append(now)


def test_wrong_tokens_by_form_or_bearer_make_a_client_wait_even_with_the_right_one() -> None:
    settings = ConsoleSettings(database_url="memory://console", console_token="t" * 24)
    with TestClient(console(settings=settings)) as client:
        page = client.get("/login")
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        for n in range(LOGIN_FAILURES):
            if n % 2:
                wrong = client.post("/login", data={"token": "x" * 24, "csrf": csrf})
                assert wrong.status_code == 401
            else:  # refused, a page asks for a login
                wrong = client.get(
                    "/", headers={"authorization": "Bearer " + "x" * 24}, follow_redirects=False
                )
                assert wrong.headers["location"] == "/login"
        for refused in (
            client.post("/login", data={"token": "t" * 24, "csrf": csrf}),
            client.get("/", headers={"authorization": "Bearer " + "t" * 24}),
        ):
            assert refused.status_code == 429
            assert 0 < int(refused.headers["retry-after"]) <= LOGIN_WINDOW
            assert "too many wrong tokens" in refused.text


def test_the_failures_of_at_most_so_many_clients_are_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(security, "TRACKED_CLIENTS", 3)
    throttle = LoginThrottle(failures=1)
    for n in range(5):
        throttle.failed(f"10.0.0.{n}")
    for forgotten in ("10.0.0.0", "10.0.0.1"):
        throttle.check(forgotten)  # forgotten: not refused
    for remembered in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
        with pytest.raises(Refused):
            throttle.check(remembered)


def test_the_chart_scales_to_a_round_top_and_spans_what_it_has() -> None:
    now = time.time()
    drawn = chart([Sample(now - 30, 120, 3), Sample(now, 80, 7)], window=900)
    assert drawn.top == 200
    assert drawn.minutes == 1  # 30 s of samples: the shortest span, a minute
    assert drawn.backlog
    assert drawn.lag
    assert chart([], window=900).backlog == ""


def test_actions_without_a_way_to_log_in_are_refused_at_start() -> None:
    settings = ConsoleSettings(database_url="memory://console", console_actions=True)
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_CONSOLE_TOKEN"):
        console(settings=settings)
    with pytest.raises(ValueError, match="name:topic"):
        ConsoleSettings(database_url="memory://console", console_inboxes=["orders"])
    with pytest.raises(ValueError, match="at least 16 characters") as short:
        ConsoleSettings(database_url="memory://console", console_token="hunter2")
    assert "hunter2" not in str(short.value)


def test_every_answer_carries_the_security_headers_and_a_token_secures_every_page() -> None:
    settings = ConsoleSettings(database_url="memory://console", console_token="t" * 24)
    with TestClient(console(settings=settings)) as client:
        for path in ("/", "/outbox", "/dead-letters", "/schemas", "/login", "/static/console.js"):
            answer = client.get(path, follow_redirects=False)
            assert answer.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
            assert "script-src 'self';" in answer.headers["content-security-policy"]
            if path not in ("/login", "/static/console.js"):
                assert answer.status_code == 303
                assert answer.headers["location"] == "/login"
        login = client.get("/login")
        assert "t" * 24 not in login.text


async def test_mounted_it_logs_in_with_the_host_apps_dependency_and_audits_its_user() -> None:
    """``console(kit, auth=…)`` in a FastAPI service: the host's dependency refuses or names
    the operator; an action with the page's CSRF token is done and audited with that name."""
    url = f"memory://console-{uuid.uuid4().hex[:8]}"
    storage = memory_database(url).outbox
    await storage.register_topics({"orders": 1})
    kit = Outboxkit(source="urn:test", settings=ConnectionSettings(database_url=url))
    app = FastAPI(lifespan=kit.lifespan)

    def operator(x_operator: Annotated[str | None, Header()] = None) -> str:
        if x_operator is None:
            raise HTTPException(401, "log in")
        return x_operator

    settings = ConsoleSettings(database_url=url, console_actions=True)
    app.mount("/outboxkit", console(kit, settings=settings, auth=operator))
    try:
        with TestClient(app) as client:
            async with kit.transaction() as tx:
                await kit.add(tx, Step(topic="orders", entity="a", seq=0))
            [record] = await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
            await storage.record_failure(record, "MessageSizeTooLargeError", give_up=True)

            assert client.get("/outboxkit/outbox").status_code == 401
            alice = {"x-operator": "alice"}
            page = client.get("/outboxkit/outbox", headers=alice)
            assert page.status_code == 200
            assert 'href="/outboxkit/dead-letters"' in page.text  # paths under the mount
            assert str(record.event_id) in page.text
            csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
            form = {"event_id": str(record.event_id), "csrf": csrf}
            assert client.post("/outboxkit/outbox/skip", data=form).status_code == 401
            with structlog.testing.capture_logs() as logs:
                done = client.post(
                    "/outboxkit/outbox/skip", data=form, headers=alice, follow_redirects=False
                )
            assert done.status_code == 303
            assert done.headers["location"] == "/outboxkit/outbox?done=skip&n=1"
            [line] = [entry for entry in logs if entry["event"] == "console action"]
            assert (line["who"], line["action"], line["records"]) == ("alice", "outbox.skip", 1)
            assert await storage.backlog() == []
    finally:
        forget_memory_database(url)
