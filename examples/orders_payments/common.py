"""What both services share: their database preparation and the relay settings they use.

The events themselves are the shared models in :mod:`outboxkit.demo.events` — the orders and
payments services, the demo and the Spark pipeline all read and write the same classes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg

from outboxkit.migrations import migrate
from outboxkit.relay import RelaySettings
from outboxkit.settings import load_settings


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
