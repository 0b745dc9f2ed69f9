"""The FastAPI application: ``create_app(store, ...)`` mounts the API under ``/api/v1``.

Other layers add their own pages with ``routers=`` (mounted at the root, e.g.
a Studio router with prefix ``/studio``) or ``app.include_router`` after
creation; they authenticate with :func:`jixu.server.context.principal`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jixu import __version__
from jixu.errors import JixuError
from jixu.ledger import Store
from jixu.runs import Provider
from jixu.runs.publication import Publisher
from jixu.runs.remote import RemoteProvider
from jixu.server import projects, runs, threads, tokens
from jixu.server.auth import Principal
from jixu.server.context import Authenticated, Services, principal
from jixu.server.guard import FailureLimit
from jixu.server.models import READ, Caller, Health
from jixu.server.problems import (
    INTERNAL,
    REQUEST_TOO_LARGE,
    error_response,
    problem_body,
    problem_response,
    validation_errors,
)
from jixu.threads import Agent

API_PREFIX = "/api/v1"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
log = logging.getLogger("jixu.server")

Lifespan = Callable[[FastAPI], Any]


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with a 413 problem, before any route reads them.

    A declared Content-Length is checked at once; a chunked body is counted as
    it is read, and buffered so the route sees it whole.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(REQUEST_TOO_LARGE, 413, f"the request body exceeds {self.limit} bytes",
                                    scope.get("path"), limit=self.limit)
        await response(scope, receive, send)


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route serves at the path of ``scope`` (what a 405's ``Allow`` header lists), found by
    asking the router, method by method, whether it would serve the path."""
    allowed: list[str] = []
    for method in _METHODS:
        probe: Scope = {"type": "http", "method": method, "path": scope["path"], "root_path": scope.get("root_path", ""),
                        "headers": []}
        if any(route.matches(probe)[0] is Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed


def _unlocated(error: JixuError, store: Store) -> JixuError:
    """``error`` without the store's location: a path or URL (a PostgreSQL one may hold a password) tells a
    caller nothing it needs and an attacker something it wants."""
    where = store.url
    if not where or (where not in error.message and not any(isinstance(v, str) and where in v
                                                              for v in error.details.values())):
        return error
    hidden = copy.copy(error)
    hidden.message = error.message.replace(where, "the store")
    hidden.details = {k: v.replace(where, "the store") if isinstance(v, str) else v for k, v in error.details.items()}
    return hidden


def _install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(JixuError)
    async def jixu_error(request: Request, error: JixuError) -> JSONResponse:
        return error_response(_unlocated(error, app.state.jixu.store), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        field, errors = validation_errors(list(error.errors()))
        first = errors[0]["message"] if errors else "invalid request"
        return problem_response("invalid_input", 422, f"{field}: {first}", request.url.path, field=field,
                                errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 400:  # a body that is not even text (bad UTF-8): invalid input, like bad JSON
            return problem_response("invalid_input", 422, f"body: {error.detail}", request.url.path, field="body")
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        headers = dict(error.headers or {})
        if error.status_code == 405:  # RFC 9110: a 405 lists what the resource does allow
            headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        return problem_response(code, error.status_code, str(error.detail), request.url.path, headers=headers or None)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error handling %s %s", request.method, request.url.path)
        return JSONResponse(problem_body(INTERNAL, 500, f"unexpected {type(error).__name__}; see the server log",
                                         request.url.path), status_code=500, media_type="application/problem+json")


meta_router = APIRouter(tags=["meta"])
caller_router = APIRouter(tags=["meta"], route_class=Authenticated)


@meta_router.get("/health", response_model=Health, summary="Liveness (no token needed)")
def health() -> dict[str, Any]:
    """``{"status": "ok", "version": …}``."""
    return {"status": "ok", "version": __version__}


@caller_router.get("/whoami", responses=READ, response_model=Caller, summary="The caller's token, roles and actor")
def whoami(caller: Annotated[Principal, Depends(principal)]) -> dict[str, Any]:
    """Who the bearer token is: token id, name, kind, role per project, the actor recorded for it."""
    return caller.to_dict()


def begin_shutdown(app: Any) -> None:
    """Tell the app its server is stopping: open event streams end (within their poll interval), so the server's
    graceful shutdown is not held up by them and its lifespan (the in-process worker's drain) runs."""
    found = getattr(getattr(app, "state", None), "jixu", None)
    if isinstance(found, Services):
        found.closing.set()


def create_app(store: Store, *, agent: Agent | None = None, providers: dict[str, Provider] | None = None,
               publishers: dict[str, Publisher] | None = None, remotes: dict[str, RemoteProvider] | None = None,
               workspace_root: Path | str = "jixu-workspaces", routers: Iterable[APIRouter] = (),
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, stream_poll_interval: float = 0.2,
               stream_recheck_interval: float = 5.0, lifespan: Sequence[Lifespan] = (),
               failed_auth_limit: FailureLimit | None = None, session_ttl: float = 12 * 3600.0) -> FastAPI:
    """The HTTP API over ``store``.

    ``agent``: the agent new threads are recorded under (without it, creating
    threads answers 409). ``providers``: the run providers (creating runs and
    handoffs need them). ``publishers`` / ``remotes``: for publication and
    remote-task requests (default: only ``git``). ``routers`` are mounted at the root after the API.
    ``lifespan``: async context managers (taking the app) entered at startup
    and left at shutdown, e.g. an in-process worker. ``stream_recheck_interval``:
    how often an open event stream checks that its caller may still read it.
    ``failed_auth_limit``: the failed authentications an address or a token id may make before 429 (default a
    burst of 20, then 10 a minute). ``session_ttl``: how long a Studio login lasts (seconds).
    A server that stops calls :func:`begin_shutdown` first, so open streams end.
    """
    entered = list(lifespan)

    @asynccontextmanager
    async def lifespan_all(app: FastAPI) -> AsyncIterator[None]:
        from contextlib import AsyncExitStack

        async with AsyncExitStack() as stack:
            for factory in entered:
                await stack.enter_async_context(factory(app))
            try:
                yield
            finally:
                begin_shutdown(app)

    app = FastAPI(title="jixu", version=__version__, lifespan=lifespan_all,
                  description="Durable agent threads and runs over a hash-chained event ledger. Authenticate with "
                              "`Authorization: Bearer jixu_<id>_<secret>`; send `Idempotency-Key` on mutations.")
    app.state.jixu = Services(store=store, agent=agent, providers=dict(providers or {}), publishers=publishers,
                              remotes=remotes,
                              workspace_root=Path(workspace_root), max_body_bytes=max_body_bytes,
                              stream_poll_interval=stream_poll_interval,
                              stream_recheck_interval=stream_recheck_interval, failed_auth_limit=failed_auth_limit,
                              session_ttl=session_ttl)
    _install_problem_handlers(app)
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(meta_router)
    api.include_router(caller_router)
    api.include_router(threads.router)
    api.include_router(runs.router)
    api.include_router(projects.router)
    api.include_router(tokens.router)
    app.include_router(api)
    for extra in routers:
        app.include_router(extra)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    return app


__all__ = ["API_PREFIX", "DEFAULT_MAX_BODY_BYTES", "BodyLimit", "begin_shutdown", "create_app"]
