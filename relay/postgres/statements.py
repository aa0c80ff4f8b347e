"""The relay's PostgreSQL stores run named statements from their ``.sql`` files, one statement
per call on a pooled autocommit connection: the relay's storage (``queries.sql``) and the
operator's repairs (``operations.sql``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, LiteralString

from psycopg.rows import TupleRow

from outboxkit.core.postgres import PooledStore
from outboxkit.relay.exceptions import StorageUnavailableError


class NamedStatements(PooledStore):
    """A pooled store whose statements are :attr:`queries`, by name."""

    unavailable = StorageUnavailableError
    queries: ClassVar[Mapping[str, LiteralString]]

    async def _execute(self, name: str, params: Mapping[str, Any]) -> int:
        """Run statement ``name``; return how many rows it changed."""
        async with self._connection() as conn:
            cur = await conn.execute(self.queries[name], params)
            return cur.rowcount

    async def _fetch(
        self, name: str, params: Mapping[str, Any], *, binary: bool = False
    ) -> list[TupleRow]:
        """Run statement ``name``; return its rows (``binary``: loaded from the binary format)."""
        async with self._connection() as conn:
            cur = await conn.execute(self.queries[name], params, binary=binary)
            return await cur.fetchall()
