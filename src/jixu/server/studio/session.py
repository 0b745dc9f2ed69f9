"""The Studio's session: the bearer token in an HttpOnly cookie, a CSRF token per session, form bodies.

The login form takes a bearer token (the same tokens as the API) and, once
:func:`jixu.server.auth.authenticate` accepts it, keeps it in a cookie the
page's scripts cannot read (``HttpOnly``) and other sites' requests do not
carry (``SameSite=Strict``), scoped to ``/studio``. Every request
authenticates the cookie again, so a revoked token stops working at once.

Every form carries a CSRF token: an HMAC of a fixed label keyed by the bearer
token. Only a page served to the cookie's holder contains it, it survives a
server restart (nothing to store) and it reveals nothing about the token. A
post whose ``Origin`` names another site is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response

from jixu.server.auth import Principal, authenticate
from jixu.server.context import services
from jixu.server.problems import FORBIDDEN, HTTPProblem

COOKIE = "jixu_studio"
COOKIE_PATH = "/studio"
CSRF_FIELD = "csrf_token"
_CSRF_LABEL = b"jixu-studio-csrf-v1"
MAX_FORM_FIELD = 200_000


def session_token(request: Request) -> str | None:
    """The bearer token the session cookie holds, if any."""
    value = request.cookies.get(COOKIE)
    return value if value else None


def session_principal(request: Request) -> Principal | None:
    """The caller of a Studio request (from the cookie), or ``None`` when not logged in or the token is bad."""
    token = session_token(request)
    if token is None:
        return None
    try:
        return authenticate(services(request).store, f"Bearer {token}")
    except HTTPProblem:
        return None


def check_token(request: Request, token: str) -> Principal:
    """The caller a pasted token names (401 problem when it is not a valid, unrevoked token)."""
    return authenticate(services(request).store, f"Bearer {token.strip()}")


def csrf_token(token: str) -> str:
    """The CSRF token of the session holding ``token``."""
    return hmac.new(token.encode("utf-8"), _CSRF_LABEL, hashlib.sha256).hexdigest()


def set_session(response: Response, request: Request, token: str) -> None:
    """Keep ``token`` in the session cookie (HttpOnly, SameSite=Strict, path /studio; Secure over https)."""
    response.set_cookie(COOKIE, token.strip(), httponly=True, samesite="strict", path=COOKIE_PATH,
                        secure=request.url.scheme == "https")


def clear_session(response: Response) -> None:
    """Forget the session cookie."""
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """False when the request says it comes from another site (its ``Origin`` or ``Referer`` host differs)."""
    host = request.headers.get("host", "")
    for header in ("origin", "referer"):
        value = request.headers.get(header)
        if value and value != "null":
            return urlsplit(value).netloc == host
    return True


async def read_form(request: Request) -> dict[str, str]:
    """A url-encoded form body as ``{field: value}`` (the first value of each field); no dependency needed."""
    body = (await request.body()).decode("utf-8", "replace")
    parsed = parse_qs(body, keep_blank_values=True, max_num_fields=100)
    return {key: values[0][:MAX_FORM_FIELD] for key, values in parsed.items() if values}


def require_csrf(request: Request, form: dict[str, str]) -> None:
    """Refuse (403) a post without this session's CSRF token or from another site."""
    token = session_token(request)
    sent = form.get(CSRF_FIELD, "")
    if token is None or not sent or not hmac.compare_digest(sent, csrf_token(token)):
        raise HTTPProblem(FORBIDDEN, "this form has no valid CSRF token: reload the page and submit it again")
    if not same_origin(request):
        raise HTTPProblem(FORBIDDEN, "this form was posted from another site")


__all__ = ["COOKIE", "CSRF_FIELD", "check_token", "clear_session", "csrf_token", "read_form", "require_csrf",
           "same_origin", "session_principal", "session_token", "set_session"]
