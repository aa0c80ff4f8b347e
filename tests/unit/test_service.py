"""The embedded service's lifecycle and settings, without servers."""

import pytest

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.inbox import Inbox
from outboxkit.service import Outboxkit, ServiceStateError


async def test_a_bad_setting_fails_the_startup_and_says_what_to_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", "postgresql://localhost/db")
    monkeypatch.delenv("OUTBOXKIT_TOPICS", raising=False)
    kit = Outboxkit(source="orders", relay=True)
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_TOPICS"):
        await kit.__aenter__()


async def test_an_inbox_consumes_its_handlers_topics_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_URL", "mongodb://localhost/db")
    monkeypatch.delenv("OUTBOXKIT_TOPICS", raising=False)
    inbox = Inbox("payments")
    for event_cls in (OrderPlaced, PaymentCaptured):
        inbox.handler(event_cls)(_noop)
    assert inbox.topics == ["shop.orders", "shop.payments"]
    _, inbox_settings, _ = Outboxkit(source="payments", inbox=inbox)._resolve_settings()
    assert inbox_settings is not None
    assert inbox_settings.topics == ["shop.orders", "shop.payments"]


async def _noop(event: object, tx: object) -> None:
    return None


async def test_the_writer_is_unavailable_outside_the_lifetime() -> None:
    kit = Outboxkit(source="orders")
    with pytest.raises(ServiceStateError, match="unopened"):
        async with kit.transaction():
            pass
    assert not kit.health().healthy
    assert kit.health().state == "unopened"
