"""A small HTTP endpoint for a worker process: ``/healthz`` (JSON, 200 or 503) and ``/metrics``
(Prometheus). Built on ``asyncio.start_server`` so a worker needs no web framework; services
that run the relay inside FastAPI use their own routes instead."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

HealthCheck = Callable[[], tuple[bool, Any]]


async def serve_probes(
    port: int,
    health: HealthCheck,
    *,
    host: str = "0.0.0.0",
    registry: CollectorRegistry = REGISTRY,
) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = (await reader.readline()).decode("latin-1").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            path = request_line[1] if len(request_line) > 1 else "/"
            if path.startswith("/metrics"):
                status, content_type, body = 200, CONTENT_TYPE_LATEST, generate_latest(registry)
            elif path.startswith("/healthz"):
                ok, detail = health()
                payload = asdict(detail) if is_dataclass(detail) else detail  # type: ignore[arg-type]
                status, content_type = (200 if ok else 503), "application/json"
                body = json.dumps(payload, default=str).encode()
            else:
                status, content_type, body = 404, "text/plain", b"not found\n"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
