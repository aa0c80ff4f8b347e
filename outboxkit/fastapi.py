"""FastAPI glue for :class:`~outboxkit.service.Outboxkit` (the ``[fastapi]`` extra).

    kit = Outboxkit(source="orders", relay=True)
    app = FastAPI(lifespan=kit.lifespan)
    app.include_router(health_router(kit))

    @app.post("/orders")
    async def place_order(order: NewOrder, kit: Annotated[Outboxkit, Depends(running(kit))]):
        async with kit.transaction() as tx:
            await tx.execute("INSERT INTO orders …", …)
            await kit.add(tx, OrderPlaced(…))

The transaction is a block in the endpoint, not a dependency with ``yield``: FastAPI runs a
dependency's exit code after the response has been built, so a commit there could fail after
the client was told the write succeeded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from outboxkit.service import Outboxkit

__all__ = ["health_router", "running"]

#: The service's transaction type: ``Outboxkit[AsyncClientSession]`` on MongoDB stays typed.
TX = TypeVar("TX")


def running(kit: Outboxkit[TX]) -> Callable[[], Outboxkit[TX]]:
    """A dependency that gives the running service, or answers 503 when it is not open. A dead
    background task does not block writes: they wait safely in the outbox (``/healthz`` and
    ``/livez`` report the failure)."""

    def dependency() -> Outboxkit[TX]:
        health = kit.health()
        if health.state != "open":
            raise HTTPException(503, f"outboxkit is {health.state}")
        return kit

    return dependency


def health_router(kit: Outboxkit[Any], *, prefix: str = "") -> APIRouter:
    """``/healthz`` (readiness: 200 or 503 with the relay's ownership and progress, the inbox's
    lag and the last errors), ``/livez`` (503 once a background task died: restart the
    process) and ``/metrics`` (Prometheus text format of the service's registry)."""
    router = APIRouter(prefix=prefix, tags=["outboxkit"])

    @router.get("/healthz")
    def healthz() -> Response:
        health = kit.health()
        body = json.dumps(asdict(health), default=str)
        return Response(body, 200 if health.healthy else 503, media_type="application/json")

    @router.get("/livez")
    def livez() -> Response:
        alive = kit.alive
        body = json.dumps({"alive": alive, "failed": kit.health().failed})
        return Response(body, 200 if alive else 503, media_type="application/json")

    @router.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(kit.registry), media_type=CONTENT_TYPE_LATEST)

    return router
