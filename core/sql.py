"""Named SQL queries kept in ``.sql`` files, loaded once.

A file holds blocks that start with a ``-- name --`` line; the comments inside a block explain
locks and indexes to the reader and are dropped from the query sent::

    -- settle_and_claim --
    -- The head of one partition: an index range scan on outbox_pending_idx.
    SELECT …
"""

from __future__ import annotations

import importlib.resources
import re
from typing import LiteralString

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def load_queries(package: str, filename: str) -> dict[str, LiteralString]:
    """Parse ``filename`` from ``package`` into ``{name: query}``."""
    text = importlib.resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, LiteralString] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{filename}: query {name!r} is defined twice")
        # Comments stay in the file, not in the query: the driver would parse a % in them.
        # The files are part of the package, never user input: safe to treat as literals.
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries
