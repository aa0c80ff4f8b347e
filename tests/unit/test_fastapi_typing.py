"""``outboxkit.fastapi`` keeps a MongoDB service typed: ``running(kit)`` of an
``Outboxkit[AsyncClientSession]`` gives that type back, and ``health_router`` takes any kit."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

SNIPPET = textwrap.dedent(
    """
    from pymongo.asynchronous.client_session import AsyncClientSession

    from outboxkit.fastapi import health_router, running
    from outboxkit.service import Outboxkit

    kit = Outboxkit[AsyncClientSession](source="urn:service:orders")
    health_router(kit)
    dependency = running(kit)
    service: Outboxkit[AsyncClientSession] = dependency()
    postgres_service: Outboxkit = dependency()  # WRONG-KIT
    health_router(Outboxkit(source="urn:service:payments"))
    """
)


def test_running_keeps_the_transaction_type_of_the_service(tmp_path: Path) -> None:
    source = tmp_path / "service.py"
    source.write_text(SNIPPET)
    out, err, status = api.run(["--strict", "--no-error-summary", str(source)])
    assert status == 1, out + err
    lines = SNIPPET.splitlines()
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    expected = {i + 1 for i, line in enumerate(lines) if "# WRONG-" in line}
    assert flagged == expected, out
