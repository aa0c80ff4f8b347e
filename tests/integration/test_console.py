"""The console in a real browser (Debian's Chromium, driven by Playwright), against real
servers, on each database: an operator watches two relays share an outbox and one of them
freeze, skips a parked record and sees its key flow, replays a dead letter once its handler is
fixed (it takes effect once), and reads every page with JavaScript off. And what it refuses,
and what its polling costs the database."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from playwright.async_api import Page, expect
from pymongo import AsyncMongoClient

from outboxkit.console import ConsoleSettings, console
from outboxkit.console.overview import Overview
from outboxkit.console.sources import Sources
from outboxkit.core.mongodb import database_name
from outboxkit.embedded._process import die_with_parent, free_port
from outboxkit.relay import TopicPartition
from outboxkit.schemas import Event, EventRegistry
from tests import timeouts
from tests.helpers import wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.console_harness import (
    browser,
    chromium,
    log_in,
    page_of,
    screenshot,
    served,
)
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    group_of,
    inbox_env,
    produce,
    wait_caught_up,
    wait_effects,
)
from tests.integration.relay_harness import (
    Big,
    RelayProcess,
    Step,
    register_topic,
    relay_env,
    relays,
    wait_pending,
)
from tests.integration.test_outbox_cli import _storage, _write

__all__ = ["chromium"]  # the session's browser, a fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOKEN = "console-test-token-0123456789"


class PaymentV2(Event, type="test.payment", version=2, key_field="entity"):
    entity: str
    seq: int
    amount: int = 1
    currency: str = "EUR"


def _registry() -> EventRegistry:
    """What the Schemas page shows: the tests' events, one type in two versions."""
    registry = EventRegistry()
    for model in (Step, Big, Payment, PaymentV2):
        registry.register(model)

    @registry.upcaster(PaymentV2, from_version=1)
    def _(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "currency": "EUR"}

    return registry


@dataclass
class _Scene:
    """Two relays on ``orders`` (one record of key ``held`` parked: too large for the topic),
    an inbox on ``payments`` whose handler fails on ``poison``, and the console on both."""

    db_url: str
    kafka: str
    tmp_path: Path
    orders: str
    payments: str
    poison: Payment = field(init=False)
    fine: Payment = field(init=False)
    parked: Big = field(init=False)

    def __post_init__(self) -> None:
        self.poison = Payment(topic=self.payments, entity="poison", seq=0, amount=42)
        self.fine = Payment(topic=self.payments, entity="fine", seq=0)
        self.parked = Big(topic=self.orders, entity="held", blob="x" * 8000)  # over 4096 bytes

    def inbox(self, failing: str) -> InboxProcess:
        env = inbox_env(self.db_url, self.kafka, self.payments, TEST_FAILING_ENTITY=failing)
        return InboxProcess(self.tmp_path, env).start()

    async def caught_up(self, what: str) -> None:
        await wait_caught_up(
            self.kafka, group_of(self.payments), self.payments, 1, within=60, what=what
        )


async def test_an_operator_watches_skips_and_replays_in_a_browser(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, chromium: str
) -> None:
    orders = await make_topic("orders", partitions=4, config={"max.message.bytes": "4096"})
    payments = await make_topic("payments")
    await make_topic(name=f"{payments}.dlq")
    await register_topic(db_url, orders, 4)
    await create_effects_table(db_url)
    scene = _Scene(db_url, kafka_bootstrap, tmp_path, orders, payments)
    relay = relay_env(db_url, kafka_bootstrap, orders, OUTBOXKIT_MAX_ATTEMPTS="1")
    settings = ConsoleSettings(
        database_url=db_url,
        kafka_bootstrap_servers=[kafka_bootstrap],
        topics=[orders],
        relay_name=relay["OUTBOXKIT_RELAY_NAME"],
        console_inboxes=[f"{payments}:{payments}"],
        console_actions=True,
        console_token=TOKEN,
        console_refresh=1.0,
        console_sensitive_fields=["amount"],
    )
    held = Step(topic=orders, entity="held", seq=1)
    others = [Step(topic=orders, entity=f"k{i}", seq=0) for i in range(8)]
    buggy = scene.inbox(failing="poison")
    with relays(tmp_path, relay, count=2) as (first, _second):
        await produce(kafka_bootstrap, [scene.fine, scene.poison])
        await _write(db_url, scene.parked, held, *others)
        app = console(settings=settings, registry=_registry())
        async with served(app) as base, browser(chromium) as chrome, page_of(chrome) as page:
            await log_in(page, base, TOKEN)
            await _two_relays_share_the_partitions(page)
            await _the_parked_record_is_skipped_and_its_key_flows(scene, page, base)
            await _the_poison_event_is_replayed_once_fixed(scene, page, base, buggy)
            await page.goto(f"{base}/schemas")
            await expect(page.locator("#schemas")).to_contain_text("v1 → v2")
            await screenshot(page, "schemas")
            await _a_frozen_relays_partitions_move(page, base, first, settings.console_refresh)
            async with page_of(chrome, javascript=False) as plain:
                await _every_page_reads_without_javascript(scene, plain, base)


async def _two_relays_share_the_partitions(page: Page) -> None:
    """The overview: two relays share the four partitions; one record is parked."""
    await expect(page.locator("#partitions tbody tr")).to_have_count(4)
    await wait_for(
        lambda: _distinct_owners(page, 2), within=60, what="both relays to own partitions"
    )
    await expect(page.locator("[data-figure=failed]")).to_have_text("1", timeout=60_000)
    await screenshot(page, "overview")


async def _the_parked_record_is_skipped_and_its_key_flows(
    scene: _Scene, page: Page, base: str
) -> None:
    await page.goto(f"{base}/outbox")
    row = page.locator(f"tr[data-event-id='{scene.parked.id}']")
    await expect(row).to_contain_text("held")
    await expect(row).to_contain_text("MessageSizeTooLarge")  # the broker's error
    await screenshot(page, "outbox")
    await row.locator("button", has_text="Skip").click()
    await expect(page.locator(".notice")).to_have_text("Skipped 1 record.")
    await wait_pending(scene.db_url, within=60, what="the held key's record to be published")


async def _the_poison_event_is_replayed_once_fixed(
    scene: _Scene, page: Page, base: str, buggy: InboxProcess
) -> None:
    """Dead letters: the poison event with its reason; the handler is fixed; Replay, after a
    confirmation; it takes effect once (the effects table)."""
    await scene.caught_up("the poison event dead-lettered")
    await page.goto(f"{base}/dead-letters")
    letter = page.locator(f"tr[data-event-id='{scene.poison.id}']")
    await expect(letter).to_contain_text("handler_failed")
    await expect(letter).to_contain_text("handler cannot process poison")
    await letter.locator("summary").click()
    await expect(letter.locator("pre")).to_contain_text('"amount": "•••"')  # a sensitive field
    await screenshot(page, "dead-letters")
    assert buggy.terminate() == 0, buggy.log()
    fixed = scene.inbox(failing="-")
    try:
        if scene.db_url.startswith("mongodb"):  # all of a reason here, a selection on PostgreSQL
            await page.click("text=Replay all 1")
        else:
            await letter.locator("input[name=letter]").check()
            await page.click("text=Replay selected")
        await expect(page.locator("h1")).to_contain_text("Replay 1 dead letter of inbox")
        await expect(page.locator(".where")).to_contain_text(f"1 to {scene.payments} partition 0")
        await screenshot(page, "replay")
        await page.click("#confirm-replay button")
        await expect(page.locator(".notice")).to_have_text("Replayed 1 dead letter.")
        # Replayed: left out of the list (as `dlq list`), shown when asked, with where it went.
        await expect(letter).to_have_count(0)
        await expect(page.locator("main")).to_contain_text("1 replayed dead letter not shown")
        await page.click("text=show them")
        await expect(letter.locator("td.replayed")).to_contain_text(
            f"replayed to {scene.payments}/0@"
        )
        await scene.caught_up("the replayed event handled")
        expected = sorted([str(scene.poison.id), str(scene.fine.id)])
        await wait_effects(
            scene.db_url,
            lambda found: sorted(str(e[0]) for e in found) == expected,
            within=30,
            what="each event to take effect once",
        )
    finally:
        assert fixed.terminate() == 0, fixed.log()


async def _a_frozen_relays_partitions_move(
    page: Page, base: str, relay: RelayProcess, refresh: float
) -> None:
    """A relay freezes: the overview, refreshing itself, shows its partitions with the other
    one within the session timeout (plus a refresh or two, and the rebalance)."""
    await page.goto(f"{base}/")
    await wait_for(lambda: _distinct_owners(page, 2), within=30, what="two owners again")
    relay.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        await wait_for(lambda: _distinct_owners(page, 1), within=60, what="one relay owning all")
        moved_after = time.monotonic() - frozen_at
    finally:
        relay.signal(signal.SIGCONT)
    bound = timeouts.SESSION_TIMEOUT + 2 * refresh + 6.0  # a rebalance on a loaded machine
    assert moved_after < bound, f"the partitions moved after {moved_after:.1f} s"
    assert await page.locator("#overview").get_attribute("data-refreshed")  # by the script


async def _every_page_reads_without_javascript(scene: _Scene, page: Page, base: str) -> None:
    await log_in(page, base, TOKEN)
    await expect(page.locator("#partitions tbody tr")).to_have_count(4)
    assert await page.locator("#overview").get_attribute("data-refreshed") is None
    await page.goto(f"{base}/dead-letters?replayed=1")
    await expect(page.locator(f"tr[data-event-id='{scene.poison.id}']")).to_contain_text("replayed")
    await page.goto(f"{base}/outbox")
    await expect(page.locator(".empty")).to_contain_text("No parked records")


async def _distinct_owners(page: Page, count: int) -> bool:
    owners = {
        (await cell.get_attribute("title")) or ""
        for cell in await page.locator("#partitions tbody td.owner").all()
    }
    return len(owners) == count and "" not in owners


async def test_an_action_without_a_login_or_a_csrf_token_is_refused(
    pg_url: str, kafka_bootstrap: str
) -> None:
    await register_topic(pg_url, "orders", 1)
    record = Step(topic="orders", entity="a", seq=0)
    await _write(pg_url, record)
    async with _storage(pg_url) as storage:
        [claimed] = await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
        await storage.record_failure(claimed, "MessageSizeTooLargeError", give_up=True)
    settings = ConsoleSettings(
        database_url=pg_url,
        kafka_bootstrap_servers=[kafka_bootstrap],
        console_actions=True,
        console_token=TOKEN,
    )
    app = console(settings=settings)
    bearer = {"authorization": f"Bearer {TOKEN}"}
    form = {"event_id": str(record.id)}
    async with served(app) as base, httpx.AsyncClient(base_url=base) as client:
        assert (await client.post("/outbox/skip", data=form)).status_code == 401
        wrong = await client.post("/outbox/skip", data=form, headers={"authorization": "Bearer x"})
        assert wrong.status_code == 401
        page = await client.get("/outbox", headers=bearer)
        assert page.status_code == 200
        assert str(record.id) in page.text
        missing = await client.post("/outbox/skip", data=form, headers=bearer)
        assert missing.status_code == 403
        assert "CSRF token is missing" in missing.text
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        forged = await client.post(
            "/outbox/skip",
            data={**form, "csrf": csrf[:-1] + ("1" if csrf.endswith("0") else "0")},
            headers=bearer,
        )
        assert forged.status_code == 403
        elsewhere = await client.post(
            "/outbox/skip",
            data={**form, "csrf": csrf},
            headers={**bearer, "origin": "https://evil.example"},
        )
        assert elsewhere.status_code == 403
        for answer in (missing, forged, elsewhere, page):
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
            assert "'unsafe-inline'" not in answer.headers["content-security-policy"]
        # Nothing was skipped; with the token and the form's CSRF token, it is.
        assert str(record.id) in (await client.get("/outbox", headers=bearer)).text
        done = await client.post("/outbox/skip", data={**form, "csrf": csrf}, headers=bearer)
        assert done.status_code == 303
        assert (
            "No parked records" in (await client.get(done.headers["location"], headers=bearer)).text
        )

    read_only = console(settings=settings.model_copy(update={"console_actions": False}))
    async with served(read_only) as base, httpx.AsyncClient(base_url=base) as client:
        refused = await client.post("/outbox/retry", data={**form, "csrf": csrf}, headers=bearer)
        assert refused.status_code == 403
        assert "read-only" in refused.text


async def test_each_refresh_of_the_overview_costs_one_backlog_query(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many viewers: the read is shared; each one is one query (the backlog's)."""
    orders = await make_topic("orders", partitions=8)
    await register_topic(db_url, orders, 8)
    await _write(db_url, *(Step(topic=orders, entity=f"k{i}", seq=0) for i in range(20)))
    settings = ConsoleSettings(
        database_url=db_url, kafka_bootstrap_servers=[kafka_bootstrap], topics=[orders]
    )
    sources = Sources.from_settings(settings)
    overview = Overview(sources, refresh=1.0, history=60.0)
    counter = _QueryCounter(db_url, monkeypatch)
    try:
        first = await overview.current()  # opens the pools and clients
        assert first.pending == 20, first
        await counter.start()
        reads = 5
        for _ in range(reads):
            overview._read_at = 0.0  # stale: the next viewer starts a read
            await asyncio.gather(*(overview.current() for _ in range(10)))  # ten viewers
            await overview.settled()  # the read they started (they did not wait for it)
        assert overview.reads == 1 + reads
        # MongoDB's backlog is two covered aggregations (pending, failed); PostgreSQL's one
        # statement, and the pool's empty check of a connection idle for a second or more.
        per_read = 2 if db_url.startswith("mongodb") else 1
        await counter.queries()
        statements = [s for s in counter.statements if s.strip()]
        assert len(statements) == reads * per_read, counter.statements
        assert len(counter.statements) - len(statements) <= reads, counter.statements
    finally:
        await counter.close()
        await overview.close()
        await sources.aclose()


class _QueryCounter:
    """Statements the console sent its database since :meth:`start`: on PostgreSQL each
    ``execute`` of a psycopg cursor on that database (nothing else uses it meanwhile), on
    MongoDB the profiler's entries for outboxkit's collections."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.url = url
        self._monkeypatch = monkeypatch
        self._mongo: AsyncMongoClient[dict[str, Any]] | None = None
        self.statements: list[str] = []

    async def start(self) -> None:
        if self.url.startswith("mongodb"):
            self._mongo = AsyncMongoClient(self.url)
            await self._mongo.get_database(database_name(self.url)).command("profile", 2)
            return
        dbname = psycopg.conninfo.conninfo_to_dict(self.url)["dbname"]
        execute = psycopg.AsyncCursor.execute

        async def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if cursor.connection.info.dbname == dbname:
                self.statements.append(str(query)[:60])
            return await execute(cursor, query, *args, **kwargs)

        self._monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)

    async def queries(self) -> int:
        if self._mongo is None:
            self._monkeypatch.undo()
            return len(self.statements)
        db = self._mongo.get_database(database_name(self.url))
        await db.command("profile", 0)
        found = await db.system.profile.find(
            {"ns": {"$regex": r"\.outboxkit\."}}, {"op": 1, "ns": 1, "command.aggregate": 1}
        ).to_list()
        self.statements = [f"{d['op']} {d['ns']}" for d in found]
        return len(found)

    async def close(self) -> None:
        if self._mongo is not None:
            await self._mongo.close()


async def test_outboxkit_console_serves_the_pages_alone_and_stops_on_sigterm(
    pg_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """``outboxkit console``, read from OUTBOXKIT_* like every worker (as against ``outboxkit
    dev up``): every page answers, and SIGTERM stops it cleanly."""
    orders = await make_topic("orders", partitions=2)
    await register_topic(pg_url, orders, 2)
    port = free_port()
    env = {
        **os.environ,
        "OUTBOXKIT_DATABASE_URL": pg_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOXKIT_TOPICS": orders,
        "OUTBOXKIT_CONSOLE_INBOXES": f"payments:{orders}",
        "OUTBOXKIT_CONSOLE_PORT": str(port),
    }
    log = tmp_path / "console.log"
    with log.open("wb") as output:
        process = subprocess.Popen(  # noqa: ASYNC220 - it returns at once
            [sys.executable, "-m", "outboxkit", "console"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no leftovers if pytest dies
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def answers() -> bool:
                try:
                    return (await client.get("/")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(answers, within=60, what="outboxkit console to answer")
            overview = (await client.get("/")).text
            assert f'data-partition="{orders}/1"' in overview
            for path in ("/outbox", "/dead-letters", "/schemas", "/static/console.css"):
                assert (await client.get(path)).status_code == 200, path
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert "Traceback" not in log.read_text()
