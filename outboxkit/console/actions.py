"""The console's actions (POST): retry or skip parked records, replay dead letters, log in and
out. Each one is refused unless the console's actions are on, the request is logged in and its
form carries the page's CSRF token; each one done is an audit line (who, what, how many). They
run the code the commands run: ``OutboxOperations.retry_failed|skip_failed`` (``outboxkit
outbox retry|skip``), ``replay_dead_letters`` (``outboxkit inbox dlq replay``)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at run time,
# and `Who` is local to the function that adds them.
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any
from uuid import UUID

import structlog
from aiokafka.errors import KafkaError
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from outboxkit.console.pages import position
from outboxkit.console.security import (
    SESSION_COOKIE,
    Refused,
    audit,
    cookie_path,
    read_form,
    set_cookie,
)
from outboxkit.core.exceptions import OutboxkitError
from outboxkit.inbox import DeadLetter, replay_dead_letters, replay_targets, unique_dead_letters
from outboxkit.inbox.deadletter import ERROR_REASON

if TYPE_CHECKING:
    from outboxkit.console.app import Console

__all__ = ["add_action_routes"]

logger = structlog.get_logger("outboxkit.console")

Form = dict[str, list[str]]


def _client(request: Request) -> str | None:
    """The address the request came from (a proxy in front: the proxy's)."""
    return request.client.host if request.client is not None else None


def _event_ids(form: Mapping[str, list[str]]) -> list[UUID]:
    """The one record a row's button names, else the ticked ones."""
    values = form.get("one") or form.get("event_id") or []
    try:
        return [UUID(value) for value in values]
    except ValueError:
        raise Refused(400, "not an event id (UUID)") from None


async def checked_form(state: "Console", request: Request, who: str | None) -> Form:
    """The action's form, once the action may be done at all (see the module)."""
    if not state.actions:
        raise Refused(403, "the console is read-only (OUTBOXKIT_CONSOLE_ACTIONS is off)")
    if who is None:
        raise Refused(401, "log in to act")
    form = await read_form(request)
    state.guard.check_csrf(request, form)
    return form


def add_action_routes(app: FastAPI, state: "Console", who: Callable[..., Any]) -> None:
    Who = Annotated[str | None, Depends(who)]
    _add_repairs(app, state, Who)
    _add_replays(app, state, Who)
    _add_logins(app, state)


def _add_repairs(app: FastAPI, state: "Console", Who: Any) -> None:

    async def repair(request: Request, who: str | None, verb: str) -> Response:
        form = await checked_form(state, request, who)
        ids = _event_ids(form)
        if not ids:
            raise Refused(400, "tick the records first")
        operations = await state.sources.operations()
        method = operations.retry_failed if verb == "retry" else operations.skip_failed
        count = await method(ids)
        audit(
            who, f"outbox.{verb}", count, client=_client(request), event_ids=[str(i) for i in ids]
        )
        url = state.path(request, "outbox", {"done": verb, "n": count})
        return RedirectResponse(url, status_code=303)

    @app.post("/outbox/retry", name="outbox_retry")
    async def outbox_retry(request: Request, who: Who) -> Response:
        return await repair(request, who, "retry")

    @app.post("/outbox/skip", name="outbox_skip")
    async def outbox_skip(request: Request, who: Who) -> Response:
        return await repair(request, who, "skip")


def _add_replays(app: FastAPI, state: "Console", Who: Any) -> None:
    async def chosen_letters(form: Form) -> tuple[str, list[DeadLetter], list[str]]:
        """The inbox, its dead letters the form names (by position, or all of a reason), each
        dead-lettering once; and the positions asked for that are no longer there."""
        name = (form.get("inbox") or [""])[0]
        view = state.sources.inbox(name)
        if view is None:
            raise Refused(400, "no such inbox")
        letters = await state.sources.dead_letters(view)
        reasons = form.get("reason")
        if reasons:  # as `outboxkit inbox dlq replay --all`: the ones not replayed yet
            reason = reasons[0]
            chosen = [
                d
                for d in letters
                if (d.header(ERROR_REASON) or "unknown") == reason and not d.replays
            ]
            missing: list[str] = []
        else:
            wanted = form.get("letter") or []
            by_position = {position(d): d for d in letters}
            chosen = [by_position[p] for p in wanted if p in by_position]
            missing = [p for p in wanted if p not in by_position]
        return name, unique_dead_letters(chosen), missing

    @app.post("/dead-letters/replay", name="replay_confirm", response_class=HTMLResponse)
    async def replay_confirm(request: Request, who: Who) -> Response:
        """Nothing is replayed yet: the page says how many would go, and where."""
        form = await checked_form(state, request, who)
        inbox, letters, missing = await chosen_letters(form)
        if not letters:
            raise Refused(400, "tick the dead letters to replay first")
        try:
            targets = replay_targets(letters, dlq_suffix=state.settings.dlq_suffix)
        except OutboxkitError as exc:
            raise Refused(400, str(exc)) from None
        where = Counter((t.topic, t.partition) for t in targets)  # (topic, partition) → how many
        return state.render(
            request,
            "replay_confirm.html",
            who,
            page="dead_letters",
            inbox=inbox,
            letters=[position(d) for d in letters],
            where=sorted(where.items(), key=lambda item: (item[0][0], item[0][1] or 0)),
            misdirected=[t for t in targets if t.misdirected is not None],
            missing=missing,
            again=[d for d in letters if d.replays],
        )

    @app.post("/dead-letters/replay/confirmed", name="replay")
    async def replay(request: Request, who: Who) -> Response:
        form = await checked_form(state, request, who)
        inbox, letters, missing = await chosen_letters(form)
        if missing:
            raise Refused(409, f"{len(missing)} of the dead letters asked for are no longer listed")
        unmarked: list[str] = []

        def not_marked(letter: DeadLetter, exc: KafkaError) -> None:
            # The replay happened; only its note in the dead-letter topic is missing.
            unmarked.append(position(letter))
            logger.warning(
                "console: a replay's marker was refused", dead_letter=position(letter), error=exc
            )

        try:
            sent = await replay_dead_letters(
                state.settings,
                letters,
                dlq_suffix=state.settings.dlq_suffix,
                on_unmarked=not_marked,
            )
        except (OutboxkitError, KafkaError) as exc:
            raise Refused(502, f"the replay failed: {exc}") from None
        audit(
            who,
            "dlq.replay",
            sent,
            client=_client(request),
            inbox=inbox,
            dead_letters=[position(d) for d in letters],
            event_ids=[d.event_id for d in letters],
            unmarked=unmarked,
        )
        url = state.path(request, "dead_letters", {"inbox": inbox, "done": "replay", "n": sent})
        return RedirectResponse(url, status_code=303)


def _add_logins(app: FastAPI, state: "Console") -> None:
    @app.post("/login", name="login")
    async def login(request: Request) -> Response:
        form = await read_form(request)
        state.guard.check_csrf(request, form)
        token = (form.get("token") or [""])[0]
        if not state.needs_login or not state.guard.login_matches(request, token):
            audit(None, "login.refused", 0, client=_client(request))
            return state.render(
                request, "login.html", None, status_code=401, page="login", failed=True
            )
        response = RedirectResponse(state.path(request, "overview"), status_code=303)
        set_cookie(
            response,
            request,
            SESSION_COOKIE,
            state.guard.new_session(),
            max_age=int(state.settings.console_session_ttl),
        )
        audit("session", "login", 0, client=_client(request))
        return response

    @app.post("/logout", name="logout")
    async def logout(request: Request) -> Response:
        form = await read_form(request)
        state.guard.check_csrf(request, form)
        response = RedirectResponse(state.path(request, "login_page"), status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))
        return response
