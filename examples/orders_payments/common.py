"""What every service of the examples shares: how an app is assembled around its ``Outboxkit``,
on PostgreSQL (this package) or MongoDB (``examples.orders_payments_mongodb``).

The events themselves are the shared models in :mod:`outboxkit.demo.events` — the orders and
payments services, the demo and the Spark pipeline all read and write the same classes; the
HTTP models are in :mod:`.models`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import structlog
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from outboxkit import configure_logging, load_settings
from outboxkit.backends import backend_for, sync_topics
from outboxkit.console import console
from outboxkit.fastapi import health_router
from outboxkit.inbox import Inbox
from outboxkit.relay import RelaySettings
from outboxkit.schemas import Event
from outboxkit.service import Outboxkit

TX = TypeVar("TX")

#: Creates a service's own tables or collections in the database at the URL it is given.
OwnSchema = Callable[[str], Awaitable[None]]


async def prepare_database(database_url: str, own_schema: OwnSchema) -> None:
    """outboxkit's migrations (what ``outboxkit migrate`` applies: tables on PostgreSQL,
    collections and indexes on MongoDB), then the service's own. For the examples only: in
    production, run ``outboxkit migrate`` (or your migration tool) in the deploy pipeline."""
    await backend_for(database_url).migrate(connect_timeout=10.0)
    await own_schema(database_url)


async def register_topics(settings: RelaySettings) -> None:
    """What ``outboxkit topics sync`` does, for the topics the service publishes: record their
    partition counts, which a writer needs to place an event. The relay records them too, but
    only once it has joined its group, seconds after the service could take its first write;
    done here, before the service answers, that first write succeeds. In production, run
    ``outboxkit topics sync`` in the deploy pipeline after ``outboxkit migrate``."""
    await sync_topics(settings, settings.topics)


def configure_service_logging() -> None:
    """Logs at ``OUTBOXKIT_LOG_LEVEL`` (info by default) in ``OUTBOXKIT_LOG_FORMAT`` (console or
    json), as the ``outboxkit`` workers log; unless the process configured structlog itself
    (structlog unconfigured prints every level, debug included)."""
    if structlog.is_configured():
        return
    log_format = os.environ.get("OUTBOXKIT_LOG_FORMAT", "console").strip().lower()
    level = os.environ.get("OUTBOXKIT_LOG_LEVEL", "info").strip() or "info"
    configure_logging("json" if log_format == "json" else "console", level)


def sql_schema(path: Path) -> OwnSchema:
    """The PostgreSQL services' own tables: the statements in ``path`` (idempotent)."""

    async def create(database_url: str) -> None:
        ddl = await asyncio.to_thread(path.read_text)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(ddl)

    return create


def relay_settings(name: str, topic: str) -> RelaySettings:
    """The service's relay publishes its own topic; everything else comes from OUTBOXKIT_*."""
    return load_settings(RelaySettings, relay_name=name, topics=[topic])


def service_app(
    name: str,
    publishes: type[Event],
    inbox: Inbox[TX],
    registry: CollectorRegistry,
    own_schema: OwnSchema,
    *,
    workers: bool = True,
) -> tuple[FastAPI, Outboxkit[TX]]:
    """A FastAPI app named ``name`` whose lifespan prepares its database (outboxkit's migrations,
    then ``own_schema``, then the partition counts of ``publishes``' topic), so that it takes
    writes from its first request, and runs its relay (publishing that topic) and ``inbox``;
    with the health router. The transaction type ``TX`` is the inbox's: a psycopg connection on
    PostgreSQL, a pymongo session on MongoDB. ``workers=False`` runs neither relay nor inbox
    (tests drive them: examples/orders_payments/tests)."""
    relay = relay_settings(name, publishes.event_topic or "") if workers else None
    kit = Outboxkit(
        source=f"urn:example:{name}",
        relay=relay or False,
        inbox=inbox if workers else None,
        registry=registry,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        configure_service_logging()
        await prepare_database(kit.database_url, own_schema)
        if relay is not None:
            await register_topics(relay)
        async with kit.lifespan(app) as state:
            yield state

    app = FastAPI(title=name, lifespan=lifespan)
    app.include_router(health_router(kit))
    # The web console (docs/console.md): read-only unless OUTBOXKIT_CONSOLE_ACTIONS and a
    # token are set; it shares the service's settings, relay and inbox.
    app.mount("/outboxkit", console(kit))
    return app, kit
