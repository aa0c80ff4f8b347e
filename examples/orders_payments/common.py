"""What both services share: how an app is assembled around its ``Outboxkit``.

The events themselves are the shared models in :mod:`outboxkit.demo.events` — the orders and
payments services, the demo and the Spark pipeline all read and write the same classes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from outboxkit.core.settings import load_settings
from outboxkit.fastapi import health_router
from outboxkit.inbox import Inbox
from outboxkit.migrations import migrate
from outboxkit.relay import RelaySettings
from outboxkit.schemas import Event
from outboxkit.service import Outboxkit


async def prepare_database(database_url: str, schema_sql: Path) -> None:
    """outboxkit's migrations, then the service's own tables. For the example only: in
    production, run ``outboxkit migrate`` (or your migration tool) in the deploy pipeline."""
    ddl = await asyncio.to_thread(schema_sql.read_text)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await migrate(conn)
        await conn.execute(ddl)


def relay_settings(name: str, topic: str) -> RelaySettings:
    """The service's relay publishes its own topic; everything else comes from OUTBOXKIT_*."""
    return load_settings(RelaySettings, relay_name=name, topics=[topic])


def service_app(
    name: str,
    publishes: type[Event],
    inbox: Inbox,
    registry: CollectorRegistry,
    *,
    workers: bool = True,
) -> tuple[FastAPI, Outboxkit]:
    """A FastAPI app named ``name`` whose lifespan prepares its database (``<name>.sql``) and
    runs its relay (publishing ``publishes``' topic) and ``inbox``; with the health router.
    ``workers=False`` runs neither (tests drive them: examples/orders_payments/tests)."""
    kit = Outboxkit(
        source=f"urn:example:{name}",
        relay=relay_settings(name, publishes.event_topic or "") if workers else False,
        inbox=inbox if workers else None,
        registry=registry,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        await prepare_database(kit.database_url, Path(__file__).with_name(f"{name}.sql"))
        async with kit.lifespan(app) as state:
            yield state

    app = FastAPI(title=name, lifespan=lifespan)
    app.include_router(health_router(kit))
    return app, kit
