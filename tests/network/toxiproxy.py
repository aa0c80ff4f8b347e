"""Toxiproxy (Shopify's TCP proxy for simulating network conditions): its server, built from
the Go module proxy and cached in ``~/.cache/outboxkit``, and a small typed async client for its
HTTP API.

The client is the test suite's, not ``outboxkit.testing``'s: a service's own tests would need
the Go build too, and PyPI's clients are unmaintained (``toxiproxy-python`` 0.1.1, 2019,
synchronous). The API (v2): ``POST /proxies`` creates a proxy, ``POST /proxies/<name>``
updates it (``enabled``), ``POST /proxies/<name>/toxics`` adds a toxic, ``DELETE`` removes
either.

Proxies used here:

- **disabled**: the proxy closes every connection through it and refuses new ones (the client
  sees a reset, then "connection refused": a partition it is told about);
- ``timeout`` with ``timeout=0``: data stops both ways, sockets stay open, new connections are
  accepted and hang (a half-open link: nothing tells the client, only its own timeouts do);
- ``latency`` (``latency``, ``jitter`` in ms), ``bandwidth`` (``rate`` KB/s), ``reset_peer``
  (``timeout`` ms, then a TCP RST), ``slicer`` (``average_size``, ``size_variation``,
  ``delay`` µs).

The server is built like the tests' other Go tools (:mod:`tests.gotools`: ``python -m
tests.gotools build toxiproxy-server``, which ``.ci/run`` runs before the tests).
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit, urlunsplit

import httpx

from outboxkit.embedded._process import free_port, port_is_open, spawn, stop_process, wait_until
from tests.gotools import TOXIPROXY

Stream = Literal["upstream", "downstream"]
ToxicType = Literal["timeout", "latency", "bandwidth", "reset_peer", "slicer", "slow_close"]


class ToxiproxyError(RuntimeError):
    """The Toxiproxy server refused a request, or could not be started."""


@dataclass
class ToxiproxyServer:
    """``toxiproxy-server`` on a free port of 127.0.0.1; proxies listen on loopback too."""

    log_dir: Path
    port: int = 0
    _process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        binary = TOXIPROXY.path()
        self.port = self.port or free_port()
        log_path = self.log_dir / "toxiproxy.log"
        self._process = spawn(
            [str(binary), "-host", "127.0.0.1", "-port", str(self.port)], log_path=log_path
        )
        wait_until(
            lambda: port_is_open(self.port),
            timeout=20,
            what="toxiproxy-server",
            process=self._process,
            log_path=log_path,
        )
        return self

    def close(self) -> None:
        if self._process is not None:
            stop_process(self._process, signal.SIGTERM, timeout=10)
            self._process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass(frozen=True)
class Proxy:
    """One proxy: ``listen`` (``127.0.0.1:<port>``, what clients connect to) forwards to
    ``upstream``."""

    client: Toxiproxy
    name: str
    listen: str
    upstream: str

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    async def disable(self) -> None:
        """Close every connection through the proxy and refuse new ones."""
        await self.client.request("POST", f"/proxies/{self.name}", json={"enabled": False})

    async def enable(self) -> None:
        await self.client.request("POST", f"/proxies/{self.name}", json={"enabled": True})

    async def add_toxic(
        self,
        kind: ToxicType,
        *,
        stream: Stream = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
        **attributes: int,
    ) -> str:
        """Add a toxic to one direction (``downstream``: server → client); returns its name."""
        name = name or f"{kind}_{stream}"
        body = {
            "name": name,
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        await self.client.request("POST", f"/proxies/{self.name}/toxics", json=body)
        return name

    async def remove_toxic(self, name: str) -> None:
        await self.client.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    async def half_open(self) -> list[str]:
        """Data stops both ways, sockets stay open (``timeout`` with ``timeout=0``)."""
        return [
            await self.add_toxic("timeout", stream=stream, timeout=0)
            for stream in ("upstream", "downstream")
        ]

    async def heal(self) -> None:
        """Enabled again, every toxic removed."""
        for toxic in await self.toxics():
            await self.remove_toxic(toxic)
        await self.enable()

    async def toxics(self) -> list[str]:
        response = await self.client.request("GET", f"/proxies/{self.name}/toxics")
        return [toxic["name"] for toxic in response.json()]

    async def delete(self) -> None:
        await self.client.request("DELETE", f"/proxies/{self.name}")


class Toxiproxy:
    """An async client of one Toxiproxy server's HTTP API."""

    def __init__(self, url: str) -> None:
        self._http = httpx.AsyncClient(base_url=url, timeout=10)

    async def request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        response = await self._http.request(method, path, **kwargs)  # type: ignore[arg-type]
        if response.status_code >= 300:
            raise ToxiproxyError(
                f"{method} {path}: HTTP {response.status_code}: {response.text.strip()}"
            )
        return response

    async def create(
        self, name: str, upstream: str, *, listen: str | None = None, enabled: bool = True
    ) -> Proxy:
        """A proxy from ``listen`` (a free loopback port by default) to ``upstream``."""
        listen = listen or f"127.0.0.1:{free_port()}"
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        created = (await self.request("POST", "/proxies", json=body)).json()
        return Proxy(self, name, created["listen"], upstream)

    async def proxies(self) -> list[str]:
        return list((await self.request("GET", "/proxies")).json())

    async def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        await self.request("POST", "/reset")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def via(proxy: Proxy, url: str) -> str:
    """``url`` with its host and port replaced by the proxy's; a MongoDB URL connects to that
    one member directly (``directConnection``): a replica set's discovery would find the
    member's own address and go around the proxy."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"{netloc[0]}@{proxy.listen}" if len(netloc) == 2 else proxy.listen
    query = parts.query
    if parts.scheme.startswith("mongodb"):
        kept = [q for q in query.split("&") if q and not q.startswith("replicaSet=")]
        query = "&".join([*kept, "directConnection=true"])
    return urlunsplit(parts._replace(netloc=host, query=query))
