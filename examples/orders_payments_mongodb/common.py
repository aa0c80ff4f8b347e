"""What both MongoDB services share: their collections live in the database that
``OUTBOXKIT_DATABASE_URL`` names (the client's default database), beside outboxkit's own
(``outboxkit.outbox``, ``outboxkit.inbox``, …), so one transaction covers a service's writes and
its events."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import CollectionInvalid

from examples.orders_payments.common import OwnSchema

Document = dict[str, Any]


def collection(session: AsyncClientSession, name: str) -> AsyncCollection[Document]:
    """Collection ``name`` of the service's database, through the session's client: the
    session of a ``kit.transaction()`` or of an inbox handler."""
    database = session.client.get_default_database()
    return database.get_collection(name)


def collections(indexes: Mapping[str, list[tuple[str, bool]]]) -> OwnSchema:
    """The service's own schema (``service_app``'s ``own_schema``): each collection, created
    before the first transaction writes to it (two transactions creating one collection would
    conflict), with its indexes as ``(field, unique)``. Safe to run again."""

    async def create(database_url: str) -> None:
        client: AsyncMongoClient[Document] = AsyncMongoClient(database_url)
        try:
            database = client.get_default_database()
            for name, fields in indexes.items():
                with contextlib.suppress(CollectionInvalid):  # it exists
                    await database.create_collection(name)
                for field, unique in fields:
                    await database[name].create_index(field, unique=unique)
        finally:
            await client.close()

    return create
