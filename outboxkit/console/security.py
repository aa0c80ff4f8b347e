"""Who may read and act through the console, and how a browser is kept from being tricked.

- **Login.** With ``OUTBOXKIT_CONSOLE_TOKEN`` set, every page needs it: as a bearer token
  (``Authorization: Bearer …``, for scripts), or typed once into the login form, which sets a
  session cookie (HttpOnly, SameSite=Strict, signed, expiring). A console mounted in an app may
  use the app's own FastAPI dependency instead (``console(kit, auth=…)``): whatever it returns
  names who acts, whatever it raises refuses. With neither, the console only reads.
- **Guessing.** A client (its address; behind a proxy, the proxy's unless the server is told
  to trust its forwarded headers) that gave a wrong token :data:`LOGIN_FAILURES` times within
  :data:`LOGIN_WINDOW` seconds is refused every login (429, ``Retry-After``) until the oldest
  of them leaves the window, even with the right token: a guess is never checked then.
- **CSRF.** Every form that changes something carries a token that only a page of the console
  could have given: a random value kept in a SameSite=Strict cookie, signed with the console's
  key (signed double submit). An action whose token is missing, unsigned or not the cookie's
  is refused (403), whatever the login; so is one whose ``Origin`` is another site.
- **Audit.** Every action is a log line ``console action`` with who, what and how many.
- **Headers.** Every answer carries a Content-Security-Policy without inline scripts or
  styles (scripts and styles come from the console's own files), ``frame-ancestors 'none'``,
  no referrer, no caching, no MIME sniffing.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import structlog
from pydantic import SecretStr
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LOGIN_FAILURES",
    "LOGIN_WINDOW",
    "SECURITY_HEADERS",
    "Guard",
    "LoginThrottle",
    "SecurityHeaders",
    "audit",
    "read_form",
]

audit_logger = structlog.get_logger("outboxkit.console.audit")

SESSION_COOKIE = "outboxkit_console_session"
CSRF_COOKIE = "outboxkit_console_csrf"
#: A form bigger than this is refused: a selection of a thousand event ids is about 40 KB.
MAX_FORM_BYTES = 256 * 1024
#: Wrong tokens one client may give within :data:`LOGIN_WINDOW` seconds before its logins are
#: refused: enough for typing mistakes, and a guesser of a 16-character token gets nowhere.
LOGIN_FAILURES = 10
LOGIN_WINDOW = 60.0
#: Clients whose failures are remembered at most, the least recently failing forgotten first:
#: memory stays bounded whatever the number of addresses trying.
TRACKED_CLIENTS = 10_000

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


class SecurityHeaders:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every answer of the console."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Refused(Exception):
    """An action or a page the request may not have: its status and what to tell the user
    (and, refused for a while, in how many seconds to try again)."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


class LoginThrottle:
    """The wrong tokens each client gave in the last ``window`` seconds (see the module)."""

    def __init__(
        self,
        failures: int = LOGIN_FAILURES,
        window: float = LOGIN_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit, self._window, self._clock = failures, window, clock
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()

    def check(self, client: str | None) -> None:
        """Refuse (429) a login of ``client`` while it has given too many wrong tokens."""
        key = client or ""  # no address (a test client, a Unix socket): all such share one
        times = self._failed.get(key)
        if times is None:
            return
        now = self._clock()
        while times and times[0] <= now - self._window:
            times.popleft()
        if not times:
            del self._failed[key]
        elif len(times) >= self._limit:
            wait = math.ceil(times[0] + self._window - now)
            audit(None, "login.throttled", 0, client=client, retry_after=wait)
            raise Refused(
                429,
                f"too many wrong tokens from this address: try again in {wait} s",
                retry_after=wait,
            )

    def failed(self, client: str | None) -> None:
        """Remember that ``client`` gave a wrong token now."""
        key = client or ""
        times = self._failed.pop(key, None) or deque()
        times.append(self._clock())
        self._failed[key] = times  # last: the least recently failing are first to forget
        while len(self._failed) > TRACKED_CLIENTS:
            self._failed.popitem(last=False)


@dataclass(frozen=True)
class Guard:
    """Logins and CSRF tokens of one console (see the module)."""

    token: SecretStr | None
    key: bytes
    session_ttl: float
    throttle: LoginThrottle = field(default_factory=LoginThrottle)

    @classmethod
    def create(cls, token: SecretStr | None, secret: SecretStr | None, session_ttl: float) -> Guard:
        key = secret.get_secret_value().encode() if secret else secrets.token_bytes(32)
        return cls(token, key, session_ttl)

    def _sign(self, purpose: str, value: str) -> str:
        token = self.token.get_secret_value() if self.token else ""
        # The token's hash is part of what is signed: changing the token ends every session.
        message = f"{purpose}:{hashlib.sha256(token.encode()).hexdigest()}:{value}"
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    # -- logins --------------------------------------------------------------------------

    def principal(self, request: Request) -> str | None:
        """Who the request is: ``bearer`` or ``session`` with a token set (:class:`Refused`
        401 without a valid one), ``None`` (anonymous, reading only) without."""
        if self.token is None:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and given:
            if self.login_matches(request, given.strip()):
                return "bearer"
            raise Refused(401, "the bearer token is not the console's")
        if self._session_valid(request.cookies.get(SESSION_COOKIE, "")):
            return "session"
        raise Refused(401, "log in first")

    def login_matches(self, request: Request, given: str) -> bool:
        """Whether ``given`` is the token, counted against the request's client when it is
        not; :class:`Refused` 429, unchecked, while that client has given too many."""
        client = request.client.host if request.client is not None else None
        self.throttle.check(client)
        if self.token is not None and hmac.compare_digest(
            given.encode(), self.token.get_secret_value().encode()
        ):
            return True
        self.throttle.failed(client)
        return False

    def new_session(self) -> str:
        expires = str(int(time.time() + self.session_ttl))
        return f"{expires}.{self._sign('session', expires)}"

    def _session_valid(self, cookie: str) -> bool:
        expires, _, signature = cookie.partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return False
        return hmac.compare_digest(signature, self._sign("session", expires))

    # -- CSRF ----------------------------------------------------------------------------

    def csrf_nonce(self, request: Request) -> tuple[str, bool]:
        """The request's CSRF cookie value, or a new one (``True``: set it on the answer)."""
        nonce = request.cookies.get(CSRF_COOKIE, "")
        if len(nonce) == 43 and nonce.replace("-", "").replace("_", "").isalnum():
            return nonce, False
        return secrets.token_urlsafe(32), True

    def csrf_token(self, nonce: str) -> str:
        """What a form carries: the nonce and its signature."""
        return f"{nonce}.{self._sign('csrf', nonce)}"

    def check_csrf(self, request: Request, form: Mapping[str, list[str]]) -> None:
        """Refuse (403) an action whose form token is missing, forged or not this browser's,
        or that comes from a page of another site."""
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            expected = f"{request.url.scheme}://{request.url.netloc}"
            if origin != expected:
                raise Refused(403, "the action comes from a page of another site")
        given = (form.get("csrf") or [""])[0]
        nonce, _, signature = given.partition(".")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not (nonce and signature and cookie):
            raise Refused(403, "the form's CSRF token is missing: reload the page and try again")
        if not (
            hmac.compare_digest(nonce, cookie)
            and hmac.compare_digest(signature, self._sign("csrf", nonce))
        ):
            raise Refused(403, "the form's CSRF token is not valid: reload the page and try again")


def set_cookie(
    response: Response, request: Request, name: str, value: str, *, max_age: int | None = None
) -> None:
    """A cookie only the console's own paths get, never readable by scripts, never sent by
    another site's page, and only over HTTPS when the console is served over HTTPS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def cookie_path(request: Request) -> str:
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return f"{root}/"


async def read_form(request: Request) -> dict[str, list[str]]:
    """The fields of a url-encoded form (a bounded body; repeated names keep every value)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=False)


def audit(who: str | None, action: str, records: int, **details: object) -> None:
    """One line per action: who, what, how many (and what exactly, in ``details``)."""
    audit_logger.info(
        "console action", who=who or "anonymous", action=action, records=records, **details
    )
