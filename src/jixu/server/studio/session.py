"""The Studio's session: a server-side session behind an opaque HttpOnly cookie, a CSRF token per session, forms.

The login form takes a bearer token (the same tokens as the API) and, once
it authenticates (rate-limited like the API's, :mod:`jixu.server.guard`),
records a session in the store (:meth:`jixu.ledger.Store.create_session`):
the cookie holds only the session's random id, never the token; the store
keeps only a digest of that id. Every server over the store sees the session,
which expires after the server's ``session_ttl`` and ends at logout, when its
token is revoked or rotated, or expires. Every request checks the session and
its token again, so an ended session or a revoked token stops working at once.

The cookie is one the page's scripts cannot read (``HttpOnly``) and other
sites' requests do not carry (``SameSite=Strict``), scoped to ``/studio``.
Every form carries a CSRF token: an HMAC of a fixed label keyed by the
session id. Only a page served to the cookie's holder contains it, it
survives a server restart (nothing more to store) and it reveals nothing
about the session. A post whose ``Origin`` names another site is refused as
well.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response

from jixu.errors import InvalidInput, JixuError
from jixu.server.auth import Principal, token_id_of, token_principal
from jixu.server.context import client_address, services
from jixu.server.problems import FORBIDDEN, UNAUTHORIZED, HTTPProblem

COOKIE = "jixu_studio"
COOKIE_PATH = "/studio"
CSRF_FIELD = "csrf_token"
_CSRF_LABEL = b"jixu-studio-csrf-v1"
MAX_FORM_FIELD = 200_000
SESSION_KEY_PREFIX = "studio/"
"""Session keys in the store: ``studio/<sha256 of the cookie's id>``."""
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{43}$")


def session_key(session_id: str) -> str:
    """The store's key of the session whose cookie holds ``session_id`` (a digest: the store never sees the id)."""
    return SESSION_KEY_PREFIX + hashlib.sha256(session_id.encode("ascii")).hexdigest()


def session_token(request: Request) -> str | None:
    """The session id the cookie holds, if it looks like one (it is not a bearer token)."""
    value = request.cookies.get(COOKIE)
    return value if value and _SESSION_ID.match(value) else None


def session_principal(request: Request) -> Principal | None:
    """The caller of a Studio request: its session's token, while the session is active and the token may still
    be used; ``None`` otherwise (not logged in, session ended or expired, token revoked or expired)."""
    session_id = session_token(request)
    if session_id is None:
        return None
    cached = getattr(request.state, "studio_principal", None)
    if isinstance(cached, Principal):
        return cached
    store = services(request).store
    found = store.get_session(session_key(session_id))
    if found is None or not found.active:
        return None
    try:
        caller = token_principal(store, found.subject)
    except JixuError:
        return None
    request.state.studio_principal = caller
    return caller


def check_token(request: Request, token: str) -> Principal:
    """The caller a pasted token names (401 problem when it is not a valid, unrevoked, unexpired token; 429 while
    this address or token failed too often)."""
    return services(request).guard.authenticate(client_address(request), f"Bearer {token.strip()}")


def csrf_token(session_id: str) -> str:
    """The CSRF token of the session ``session_id``."""
    return hmac.new(session_id.encode("utf-8"), _CSRF_LABEL, hashlib.sha256).hexdigest()


def set_session(response: Response, request: Request, token: str) -> None:
    """Start a server-side session for ``token`` (already checked by :func:`check_token`) and put its id in the
    cookie (HttpOnly, SameSite=Strict, path /studio, Secure over https, gone when the session expires)."""
    token_id = token_id_of(f"Bearer {token.strip()}")
    if token_id is None:
        raise HTTPProblem(UNAUTHORIZED, "the token must be jixu_<id>_<secret>")
    found = services(request)
    session_id = secrets.token_urlsafe(32)
    found.store.create_session(session_key(session_id), token_id, found.session_ttl)
    response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict", path=COOKIE_PATH,
                        secure=request.url.scheme == "https", max_age=int(found.session_ttl))


def end_session(request: Request) -> None:
    """End the request's session in the store (logout): on every server, at once."""
    session_id = session_token(request)
    if session_id is not None:
        services(request).store.revoke_session(session_key(session_id))


def clear_session(response: Response) -> None:
    """Forget the session cookie (:func:`end_session` ends the session itself)."""
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """False when the request says it comes from another site (its ``Origin`` or ``Referer`` host differs)."""
    host = request.headers.get("host", "")
    for header in ("origin", "referer"):
        value = request.headers.get(header)
        if value and value != "null":
            return urlsplit(value).netloc == host
    return True


MAX_FORM_FIELDS = 100
"""Fields a form posted to the Studio may have (its own have a handful)."""


async def read_form(request: Request) -> dict[str, str]:
    """A url-encoded form body as ``{field: value}`` (the first value of each field); no dependency needed."""
    body = (await request.body()).decode("utf-8", "replace")
    try:
        parsed = parse_qs(body, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except ValueError:  # more fields than any form of the Studio has
        raise InvalidInput(f"a form of more than {MAX_FORM_FIELDS} fields is refused", field="form") from None
    return {key: values[0][:MAX_FORM_FIELD] for key, values in parsed.items() if values}


def require_csrf(request: Request, form: dict[str, str]) -> None:
    """Refuse (403) a post without this session's CSRF token or from another site."""
    session_id = session_token(request)
    sent = form.get(CSRF_FIELD, "")
    # As bytes: compare_digest refuses a str with a character beyond ASCII (a TypeError, a 500, not a refusal).
    if session_id is None or not sent or not hmac.compare_digest(sent.encode("utf-8"),
                                                                 csrf_token(session_id).encode("utf-8")):
        raise HTTPProblem(FORBIDDEN, "this form has no valid CSRF token: reload the page and submit it again")
    if not same_origin(request):
        raise HTTPProblem(FORBIDDEN, "this form was posted from another site")


__all__ = ["COOKIE", "CSRF_FIELD", "SESSION_KEY_PREFIX", "check_token", "clear_session", "csrf_token", "end_session",
           "read_form", "require_csrf", "same_origin", "session_key", "session_principal", "session_token",
           "set_session"]
