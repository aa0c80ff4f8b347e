"""The console's pages (GET): overview, outbox, dead letters, schemas, login. Each reads through
:class:`~outboxkit.console.sources.Sources`, the code the commands run, and never more than
``console_page_size`` records."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at run time,
# and `Who` is local to the function that adds them.
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from aiokafka.errors import KafkaError
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse

from outboxkit.console.payloads import show_payload
from outboxkit.core.exceptions import OutboxkitError
from outboxkit.core.printable import key_text
from outboxkit.inbox import DeadLetter, DeadLetterReplay, unique_dead_letters
from outboxkit.relay import RecordInfo
from outboxkit.schemas import EventRegistry, WireHeader

if TYPE_CHECKING:
    from outboxkit.console.app import Console

__all__ = ["LetterRow", "add_page_routes", "letter_rows", "position"]


def position(letter: DeadLetter) -> str:
    """A dead letter's place in its dead-letter topic: how forms name it."""
    return f"{letter.topic}/{letter.partition}@{letter.offset}"


@dataclass(frozen=True)
class LetterRow:
    """A dead letter as the page shows it."""

    position: str
    letter: DeadLetter
    summary: dict[str, object]
    version: str | None
    payload: str
    #: A later copy of an earlier dead-lettering of the same record (dead-lettering is at
    #: least once): replaying the first replays it.
    copy: bool

    @property
    def replays(self) -> tuple[DeadLetterReplay, ...]:
        """Its replays (of it or of a copy), oldest first, as their markers tell."""
        return self.letter.replays


def letter_rows(
    letters: Sequence[DeadLetter], *, sensitive: Sequence[str], limit: int
) -> list[LetterRow]:
    first = {id(letter) for letter in unique_dead_letters(letters)}
    return [
        LetterRow(
            position=position(letter),
            letter=letter,
            summary=letter.summary(),
            version=letter.header(WireHeader.SCHEMA_VERSION),
            payload=show_payload(letter.value, sensitive=sensitive, limit=limit),
            copy=id(letter) not in first,
        )
        for letter in letters
    ]


@dataclass(frozen=True)
class SchemaRow:
    event_type: str
    topic: str | None
    versions: tuple[int, ...]
    readable: tuple[int, ...]
    #: version read through upcasters → the model version it ends in
    upcasts: dict[int, int]
    models: list[str]


def schema_rows(registry: EventRegistry) -> list[SchemaRow]:
    rows: dict[str, SchemaRow] = {}
    for model in registry:
        name = model.event_type
        if name in rows:
            rows[name].models.append(f"{model.__module__}.{model.__qualname__}")
            continue
        rows[name] = SchemaRow(
            event_type=name,
            topic=model.event_topic,
            versions=registry.versions(name),
            readable=registry.readable_versions(name),
            upcasts={v: m.event_version for v, m in registry.upcast_versions(name).items()},
            models=[f"{model.__module__}.{model.__qualname__}"],
        )
    return list(rows.values())


def add_page_routes(app: FastAPI, state: "Console", who: Callable[..., Any]) -> None:
    Who = Annotated[str | None, Depends(who)]

    @app.get("/", name="overview", response_class=HTMLResponse)
    async def overview(request: Request, who: Who) -> HTMLResponse:
        snapshot = await state.overview.current()
        return state.render(request, "overview.html", who, snap=snapshot, page="overview")

    @app.get("/overview/live", name="overview_live", response_class=HTMLResponse)
    async def overview_live(request: Request, who: Who) -> HTMLResponse:
        """The overview's figures alone: what the page's script swaps in at each refresh."""
        snapshot = await state.overview.current()
        return state.render(request, "_overview.html", who, snap=snapshot)

    @app.get("/outbox", name="outbox", response_class=HTMLResponse)
    async def outbox(
        request: Request, who: Who, done: str | None = None, n: int | None = None
    ) -> HTMLResponse:
        records: list[RecordInfo] = []
        error = None
        try:
            operations = await state.sources.operations()
            records = await operations.list_records("failed", state.settings.console_page_size)
        except OutboxkitError as exc:
            error = str(exc)
        return state.render(
            request,
            "outbox.html",
            who,
            page="outbox",
            records=records,
            key_text=key_text,
            error=error,
            done=done if done in ("retry", "skip") else None,
            count=n,
        )

    @app.get("/dead-letters", name="dead_letters", response_class=HTMLResponse)
    async def dead_letters(
        request: Request,
        who: Who,
        *,
        inbox: str | None = None,
        replayed: bool = False,
        done: str | None = None,
        n: int | None = None,
    ) -> HTMLResponse:
        views = state.sources.inboxes
        view = state.sources.inbox(inbox) if inbox else (views[0] if views else None)
        rows: list[LetterRow] = []
        error = None
        if view is not None:
            try:
                letters = await state.sources.dead_letters(view)
            except (OutboxkitError, KafkaError) as exc:
                error = str(exc) or type(exc).__name__
            else:
                rows = letter_rows(
                    letters,
                    sensitive=state.settings.console_sensitive_fields,
                    limit=state.settings.console_payload_limit,
                )
        # As `outboxkit inbox dlq list`: the dead letters replayed already only when asked.
        hidden = 0 if replayed else sum(1 for r in rows if r.replays)
        shown = [r for r in rows if replayed or not r.replays]
        reasons = Counter(
            str(r.summary["reason"] or "unknown") for r in rows if not r.copy and not r.replays
        )
        return state.render(
            request,
            "dead_letters.html",
            who,
            page="dead_letters",
            views=views,
            view=view,
            rows=shown,
            hidden=hidden,
            replayed=replayed,
            reasons=sorted(reasons.items()),
            full=len(rows) >= state.settings.console_page_size,
            error=error,
            done=done if done == "replay" else None,
            count=n,
        )

    @app.get("/schemas", name="schemas", response_class=HTMLResponse)
    async def schemas(request: Request, who: Who) -> HTMLResponse:
        registry = state.sources.registry
        rows = schema_rows(registry) if registry is not None else []
        return state.render(
            request, "schemas.html", who, page="schemas", registry=registry, rows=rows
        )

    @app.get("/login", name="login_page", response_class=HTMLResponse)
    async def login_page(request: Request) -> HTMLResponse:
        return state.render(request, "login.html", None, page="login", failed=False)
