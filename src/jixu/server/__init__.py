"""The HTTP interface: a FastAPI app over a store, bearer tokens with project roles, idempotent mutations.

``create_app(store, ...)`` builds the app (``jixu serve`` runs it with
uvicorn); :func:`principal` is the dependency that authenticates a request,
for routers mounted beside the API; :class:`Client` is the HTTP client the
CLI's remote mode uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jixu.server.app import API_PREFIX, create_app
    from jixu.server.auth import ROLES, Principal, TokenInfo, create_token, list_tokens, revoke_token
    from jixu.server.context import Context, Services, context, principal

_WHERE = {"API_PREFIX": "app", "create_app": "app", "ROLES": "auth", "Principal": "auth", "TokenInfo": "auth",
          "create_token": "auth", "list_tokens": "auth", "revoke_token": "auth", "Context": "context",
          "Services": "context", "context": "context", "principal": "context"}


def __getattr__(name: str) -> Any:
    # Imported on first use: the CLI's remote client (jixu.server.client) must not load FastAPI.
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'jixu.server' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jixu.server.{module}"), name)

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
