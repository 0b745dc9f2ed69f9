"""The HTTP interface: a FastAPI app over a store, bearer tokens with project roles, idempotent mutations.

``create_app(store, ...)`` builds the app (``jixu serve`` runs it with
uvicorn); :func:`principal` is the dependency that authenticates a request,
for routers mounted beside the API; :class:`Client` is the HTTP client the
CLI's remote mode uses.
"""

from __future__ import annotations

from jixu.server.app import API_PREFIX, create_app
from jixu.server.auth import ROLES, Principal, TokenInfo, create_token, list_tokens, revoke_token
from jixu.server.context import Context, Services, context, principal

__all__ = [
    "API_PREFIX",
    "ROLES",
    "Context",
    "Principal",
    "Services",
    "TokenInfo",
    "context",
    "create_app",
    "create_token",
    "list_tokens",
    "principal",
    "revoke_token",
]
