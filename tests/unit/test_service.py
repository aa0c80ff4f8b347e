"""The embedded service's lifecycle and settings, without servers."""

import logging
import uuid
from typing import cast

import pytest
import structlog
from fastapi import FastAPI
from httpx import ASGITransport, AsyncClient
from prometheus_client import CollectorRegistry

from outboxkit.backends import Transactions, forget_memory_database, memory_database
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import ConnectionSettings
from outboxkit.demo.events import OrderPlaced, PaymentCaptured
from outboxkit.fastapi import health_router
from outboxkit.inbox import Inbox
from outboxkit.relay import UnknownTopicError
from outboxkit.schemas import Event
from outboxkit.service import Outboxkit, ServiceStateError
from tests.helpers import LosesOneCancellation, wait_for


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


async def test_not_ready_while_a_written_topic_is_not_registered() -> None:
    """#44: with `outboxkit topics sync` skipped, /healthz said 200 while the first POST got a
    500 (the writer's topic not registered). Readiness now waits for the topics of `writes`."""
    url = f"memory://not-ready-{uuid.uuid4().hex}"
    kit = Outboxkit(
        source="orders",
        settings=ConnectionSettings(database_url=url),
        writes=[_Placed],
        registry=CollectorRegistry(),
    )
    kit.topics_recheck = 0.02
    app = FastAPI(lifespan=kit.lifespan)
    app.include_router(health_router(kit))
    try:
        async with kit, AsyncClient(transport=ASGITransport(app), base_url="http://t") as client:
            not_ready = await client.get("/healthz")
            assert not_ready.status_code == 503
            assert not_ready.json()["unregistered_topics"] == ["test.service.orders"]
            with pytest.raises(UnknownTopicError):  # what a request's write would meet
                async with kit.transaction() as tx:
                    await kit.add(tx, _order())
            # What `outboxkit topics sync` does.
            await memory_database(url).outbox.register_topics({"test.service.orders": 3})

            async def ready() -> bool:
                return (await client.get("/healthz")).status_code == 200

            await wait_for(ready, within=5, what="ready once the topic is registered")
            assert (await client.get("/healthz")).json()["unregistered_topics"] == []
            async with kit.transaction() as tx:
                await kit.add(tx, _order())
    finally:
        forget_memory_database(url)


async def test_the_topics_check_ends_when_its_database_call_lost_the_cancellation() -> None:
    """Would catch a lifespan whose shutdown waits for good: it awaits the cancelled readiness
    check, which on MongoDB could lose its cancellation in a driver call (core/waiting.py) and
    look again every few seconds until the topics were registered."""
    kit = Outboxkit(source="orders", writes=[_Placed], registry=CollectorRegistry())
    kit.topics_recheck = 0.01
    loses = LosesOneCancellation()

    class Registered:
        async def registered_topics(self, topics: list[str]) -> set[str]:
            await loses()
            return set()

    await loses.assert_ends_when_cancelled(
        kit._await_topics(cast(Transactions, Registered())), "the topics check"
    )


class _Placed(Event, type="test.service.placed", topic="test.service.orders", key_field="order_id"):
    order_id: str


def _order() -> _Placed:
    return _Placed(order_id="o-1")


async def test_a_service_in_a_process_without_log_configuration_logs_no_debug_lines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """structlog unconfigured prints every level: a service's "[debug] cannot read the
    registered topics" showed at the default level in an app that configured no logging. The
    service now leaves out what is below OUTBOXKIT_LOG_LEVEL, and only in such a process."""
    monkeypatch.delenv("OUTBOXKIT_LOG_LEVEL", raising=False)
    structlog.reset_defaults()  # the conftest fixture restores what was before
    url = f"memory://quiet-{uuid.uuid4().hex}"
    log = structlog.get_logger("outboxkit.test")
    try:
        async with Outboxkit(
            source="orders",
            settings=ConnectionSettings(database_url=url),
            registry=CollectorRegistry(),
        ):
            log.debug("a debug line")
            log.info("an info line")
    finally:
        forget_memory_database(url)
    printed = capsys.readouterr().out
    assert "an info line" in printed
    assert "a debug line" not in printed
    # A process that configured structlog keeps its own configuration.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    async with Outboxkit(
        source="orders", settings=ConnectionSettings(database_url=url), registry=CollectorRegistry()
    ):
        log.debug("a debug line")
    forget_memory_database(url)
    assert "a debug line" in capsys.readouterr().out
