"""The console's ASGI app: :func:`console` builds it, mounted in a FastAPI service or alone.

    kit = Outboxkit(source="orders", relay=True, inbox=inbox)
    app = FastAPI(lifespan=kit.lifespan)
    app.mount("/outboxkit", console(kit))

Pages are rendered on the server (Jinja2); a little script of the console's own refreshes the
overview in place, and without it every page reads the same (the overview then reloads itself).
What each page reads, and through which code, is in :mod:`outboxkit.console.sources`; who may
do what in :mod:`outboxkit.console.security`.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of the dependency
# made in _who_dependency at run time, and the host app's dependency in them is a local name.
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any
from urllib.parse import urlencode

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape

from outboxkit._version import __version__
from outboxkit.cli.schemas import import_registry
from outboxkit.console.actions import add_action_routes
from outboxkit.console.chart import chart
from outboxkit.console.overview import Overview
from outboxkit.console.pages import add_page_routes
from outboxkit.console.security import (
    CSRF_COOKIE,
    Guard,
    Refused,
    SecurityHeaders,
    set_cookie,
)
from outboxkit.console.settings import ConsoleSettings, InboxView
from outboxkit.console.sources import Sources
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.printable import printable
from outboxkit.core.settings import ConnectionSettings, load_settings
from outboxkit.schemas import EventRegistry
from outboxkit.service import Outboxkit

__all__ = ["Console", "console"]

logger = structlog.get_logger("outboxkit.console")

#: A FastAPI dependency of the host app: what it returns names who acts, what it raises refuses.
AuthDependency = Callable[..., Any]


class Console:
    """What the routes share: settings, sources, the overview's reader, logins, templates."""

    def __init__(
        self,
        settings: ConsoleSettings,
        sources: Sources,
        overview: Overview,
        guard: Guard,
        *,
        host_auth: bool,
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.overview = overview
        self.guard = guard
        #: The host app's dependency says who is logged in (not the console's token).
        self.host_auth = host_auth
        env = Environment(
            loader=PackageLoader("outboxkit.console", "templates"),
            autoescape=select_autoescape(default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters["printable"] = printable
        env.globals["version"] = __version__
        env.globals["chart"] = lambda samples: chart(samples, settings.console_history)
        self.templates = Jinja2Templates(env=env)

    @property
    def actions(self) -> bool:
        return self.settings.console_actions

    @property
    def needs_login(self) -> bool:
        return self.settings.console_token is not None and not self.host_auth

    def path(
        self, request: Request, name: str, query: dict[str, Any] | None = None, **params: Any
    ) -> str:
        """The path of route ``name`` as the browser reaches it (under the mount's prefix): pages
        link by path, never by an absolute URL a proxy in front would have to rewrite."""
        path = request.scope.get("root_path", "") + request.app.url_path_for(name, **params)
        return f"{path}?{urlencode(query)}" if query else path

    def render(
        self,
        request: Request,
        template: str,
        who: str | None,
        status_code: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        """A page, with a CSRF token for its forms (and the cookie it goes with, if new)."""
        nonce, new = self.guard.csrf_nonce(request)
        response = self.templates.TemplateResponse(
            request,
            template,
            {
                "who": who,
                "url": lambda name, query=None, **params: self.path(request, name, query, **params),
                "actions": self.actions,
                "login": self.needs_login,
                "csrf": self.guard.csrf_token(nonce),
                "refresh": self.settings.console_refresh,
                # A partition whose oldest record waited longer is stalled, as its relay says.
                "relay_stall_after": self.sources.relay.stall_after if self.sources.relay else None,
                "settings": self.settings,
                **context,
            },
            status_code=status_code,
        )
        if new:
            set_cookie(response, request, CSRF_COOKIE, nonce)
        return response


def console(
    kit: Outboxkit[Any] | None = None,
    *,
    settings: ConsoleSettings | None = None,
    registry: EventRegistry | None = None,
    auth: AuthDependency | None = None,
) -> FastAPI:
    """The console as an ASGI app (a FastAPI app; ``[console]`` extra).

    Mounted in a service, ``kit`` is the service's :class:`~outboxkit.service.Outboxkit`: the
    console reads its database and Kafka, shows its relay's group and its inbox, decodes with
    its inbox's registry, and closes with it. ``settings`` default to the environment
    (``OUTBOXKIT_*``, the console's own under ``OUTBOXKIT_CONSOLE_*``). ``auth``: a FastAPI
    dependency of the host app that logs operators in (it returns who they are, or raises
    401/403); without it, ``OUTBOXKIT_CONSOLE_TOKEN`` does. Actions
    (``OUTBOXKIT_CONSOLE_ACTIONS``) need one of them: :class:`ConfigurationError` otherwise.
    """
    settings = settings or _settings_of(kit)
    if settings.console_actions and settings.console_token is None and auth is None:
        raise ConfigurationError(
            "OUTBOXKIT_CONSOLE_ACTIONS is on but nobody could log in to act: set "
            "OUTBOXKIT_CONSOLE_TOKEN (or mount the console with the app's own auth dependency, "
            "console(kit, auth=...))"
        )
    if registry is None and kit is not None and kit.inbox is not None:
        registry = kit.inbox.registry
    if registry is None and settings.console_registry:
        registry = import_registry(settings.console_registry)
    inboxes: list[InboxView] = []
    if kit is not None and kit.inbox is not None and kit.inbox_settings is not None:
        inboxes.append(InboxView(kit.inbox.name, tuple(kit.inbox_settings.topics)))
    sources = Sources.from_settings(
        settings,
        relay=kit.relay_settings if kit is not None else None,
        inboxes=inboxes,
        registry=registry,
    )
    local = None
    if kit is not None:
        service = kit

        def local() -> Any:
            return service.relay.health() if service.relay is not None else None

    overview = Overview(
        sources,
        refresh=settings.console_refresh,
        history=settings.console_history,
        local=local,
    )
    state = Console(
        settings,
        sources,
        overview,
        Guard.create(settings.console_token, settings.console_secret, settings.console_session_ttl),
        host_auth=auth is not None,
    )

    async def close() -> None:
        await overview.close()
        await sources.aclose()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Run only where the console is the app served (`outboxkit console`): a mounted app's
        # lifespan is not run by its host, so there it closes with the service (on_close).
        try:
            yield
        finally:
            await close()

    app = FastAPI(
        title="outboxkit console",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.console = state
    if kit is not None:
        kit.on_close(close)
    app.add_middleware(SecurityHeaders)
    app.mount("/static", StaticFiles(packages=[("outboxkit.console", "static")]), name="static")
    who = _who_dependency(state, auth)
    add_page_routes(app, state, who)
    add_action_routes(app, state, who)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        if exc.status == 401 and state.needs_login and request.method == "GET":
            return RedirectResponse(state.path(request, "login_page"), status_code=303)
        answer = state.render(
            request, "refused.html", None, status_code=exc.status, message=exc.message
        )
        if exc.retry_after is not None:
            answer.headers["retry-after"] = str(exc.retry_after)
        return answer

    if not settings.console_token and auth is None:
        logger.warning(
            "the console needs no login: anyone who reaches it can read it (set "
            "OUTBOXKIT_CONSOLE_TOKEN, or mount it with your app's auth dependency)"
        )
    return app


def _who_dependency(state: Console, auth: AuthDependency | None) -> Callable[..., Any]:
    """The dependency every route takes: who the request is (``None``: anonymous, reading)."""
    if auth is not None:
        host_auth = auth

        async def from_host(request: Request, user: Annotated[Any, Depends(host_auth)]) -> str:
            return _name_of(user)

        return from_host

    async def from_token(request: Request) -> str | None:
        return state.guard.principal(request)

    return from_token


def _name_of(user: Any) -> str:
    """How the audit names who the host app's dependency returned."""
    for attribute in ("username", "name", "email", "id"):
        value = getattr(user, attribute, None)
        if isinstance(value, str | int) and value != "":
            return str(value)
    return str(user) if user not in (None, True) else "user"


def _settings_of(kit: Outboxkit[Any] | None) -> ConsoleSettings:
    """The environment's console settings; mounted, on the service's database and Kafka,
    its relay's name, its inbox's dead-letter suffix and stall time."""
    if kit is None:
        return load_settings(ConsoleSettings)
    given: dict[str, Any] = {
        name: getattr(kit.settings, name) for name in ConnectionSettings.model_fields
    }
    if kit.relay_settings is not None:
        given["relay_name"] = kit.relay_settings.relay_name
        given["topics"] = kit.relay_settings.topics
    else:  # the topics of the service's settings are its inbox's: the outbox's are unknown
        given["topics"] = []
    if kit.inbox_settings is not None:
        given["dlq_suffix"] = kit.inbox_settings.dlq_suffix
        given["stall_after"] = kit.inbox_settings.stall_after
    return load_settings(ConsoleSettings, **given)
