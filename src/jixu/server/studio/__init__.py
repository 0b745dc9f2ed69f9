"""The Studio: web pages for inspecting and continuing threads and runs, served by ``jixu serve`` at ``/studio``.

Server-rendered HTML (Jinja2, autoescaped) with one small script for live
updates; no CDN, so it works offline. It logs in with the API's bearer tokens
(kept in an HttpOnly, SameSite=Strict cookie), protects every form with a
CSRF token, and performs every operation through the API's own route
functions, so roles and rules are the same as over HTTP. Mount it with
``create_app(store, routers=[studio_router()])``.
"""

from __future__ import annotations

from fastapi import APIRouter

from jixu.server.studio.routes import PREFIX, router


def studio_router() -> APIRouter:
    """The Studio's router (prefix ``/studio``), for ``create_app(..., routers=[studio_router()])``."""
    return router


__all__ = ["PREFIX", "studio_router"]
