"""The console's tests: one headless Chromium per test session (Debian's ``chromium``, driven by
Playwright over the DevTools protocol: no browser download), the console served by uvicorn
inside the test, and screenshots for docs/console.md.

Chromium starts once, in the first test that asks for it (``chromium`` fixture), with the
flags this machine needs (no sandbox as root, no background networking: every connection to
Google's hosts would be refused here). Each test connects to it with a Playwright of its own
event loop and opens its own contexts, so nothing leaks from one test to the next.

``TEST_CONSOLE_SCREENSHOTS=docs/console`` makes the tests write the pages' screenshots there
(``python -m pytest tests/integration/test_console.py -k postgresql`` with it refreshes the
ones docs/console.md shows).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.async_api import Browser, Page, async_playwright

from outboxkit.embedded._process import die_with_parent, free_port, wait_until
from tests.helpers import wait_for

CHROMIUM = "/usr/bin/chromium"
#: Headless as root, on a machine whose network reaches only itself.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
SCREENSHOTS = os.environ.get("TEST_CONSOLE_SCREENSHOTS")


@pytest.fixture(scope="session")
def chromium() -> Iterator[str]:
    """The DevTools endpoint (``ws://…``) of the session's Chromium."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")
    profile = Path(tempfile.mkdtemp(prefix="console-chromium-"))
    log = profile / "chromium.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}"],
            stdout=subprocess.DEVNULL,
            stderr=output,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no browser left behind if pytest dies
        )
    try:

        def devtools() -> re.Match[str] | None:
            return re.search(r"DevTools listening on (ws://\S+)", log.read_text(errors="replace"))

        wait_until(
            lambda: devtools() is not None,
            timeout=30,
            what="Chromium's DevTools endpoint",
            process=process,
            log_path=log,
        )
        found = devtools()
        assert found is not None
        yield found.group(1)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def browser(endpoint: str) -> AsyncIterator[Browser]:
    """The session's Chromium, reached from this test's event loop."""
    async with async_playwright() as playwright:
        connected = await playwright.chromium.connect_over_cdp(endpoint)
        try:
            yield connected
        finally:
            await connected.close()


@contextlib.asynccontextmanager
async def page_of(connected: Browser, *, javascript: bool = True) -> AsyncIterator[Page]:
    """A page in a context of its own (its own cookies), 1280 px wide."""
    context = await connected.new_context(
        viewport={"width": 1280, "height": 800}, java_script_enabled=javascript
    )
    try:
        page = await context.new_page()
        page.set_default_timeout(20_000)
        yield page
    finally:
        await context.close()


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free port of 127.0.0.1 in this event loop: its URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, within=20, what="the console to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


async def screenshot(page: Page, name: str) -> None:
    """Save the page for docs/console.md, when TEST_CONSOLE_SCREENSHOTS asks."""
    if SCREENSHOTS:
        await asyncio.to_thread(Path(SCREENSHOTS).mkdir, parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


async def log_in(page: Page, base: str, token: str) -> None:
    await page.goto(f"{base}/")
    assert page.url.endswith("/login"), page.url
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/")
