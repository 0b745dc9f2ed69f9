"""What every route needs: the server's services, the authenticated caller, and idempotent mutations.

Other modules (routers here, the Studio) get them through FastAPI
dependencies: ``Depends(principal)`` for the caller of a request,
``Depends(context)`` for caller + services + request id.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from jixu.errors import InvalidInput
from jixu.ledger import Store
from jixu.runs import Provider, Runs
from jixu.runs.publication import Publisher
from jixu.runs.remote import RemoteProvider
from jixu.server.auth import Principal
from jixu.server.guard import AuthGuard, FailureLimit
from jixu.server.idempotency import HEADER, REQUEST_ID_PATTERN, Outcome, run_once
from jixu.server.problems import AGENT_NOT_CONFIGURED, UNAUTHORIZED, HTTPProblem
from jixu.threads import Agent

T = TypeVar("T")

REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass
class Services:
    """The store and what the server runs with: the agent new threads are recorded under, the runs service."""

    store: Store
    agent: Agent | None = None
    providers: dict[str, Provider] = field(default_factory=dict)
    publishers: dict[str, Publisher] | None = None
    """Publication providers (None: only ``git``)."""
    remotes: dict[str, RemoteProvider] | None = None
    """Deploy / rollback / knowledge-write providers."""
    workspace_root: Path = Path("jixu-workspaces")
    max_body_bytes: int = 1024 * 1024
    stream_poll_interval: float = 0.2
    stream_recheck_interval: float = 5.0
    """How often an open event stream checks again that its caller may still read it (a revoked token's stream
    ends within this)."""
    closing: threading.Event = field(default_factory=threading.Event)
    """Set when the server begins to shut down: open streams end, so the server can drain and exit."""
    thread_projects: dict[str, str] = field(default_factory=dict)
    """Thread stream -> project, as its first (immutable) event says; filled as threads are read."""
    failed_auth_limit: FailureLimit | None = None
    """How many failed authentications an address (and a token id) may make: a burst, then so many a minute."""
    session_ttl: float = 12 * 3600.0
    """How long a Studio login lasts (seconds)."""
    work_queued: list[Callable[[], None]] = field(default_factory=list)
    """Called after every mutation that may have put work in the queue (the in-process worker registers its
    :meth:`~jixu.scheduling.Worker.nudge`, so a turn sent over HTTP is claimed at once, not at its next poll)."""
    runs: Runs = field(init=False)
    guard: AuthGuard = field(init=False)

    def __post_init__(self) -> None:
        self.guard = AuthGuard(self.store, per_address=self.failed_auth_limit, per_token=self.failed_auth_limit)
        # An owner name of this process only, so a run another process executes never looks like its own.
        owner = f"jixu-server-{os.getpid()}@{socket.gethostname()}"
        self.runs = Runs(self.store, self.workspace_root, self.providers, owner=owner, actor="jixu-server",
                         publishers=self.publishers, remotes=self.remotes)

    def require_agent(self) -> Agent:
        """The configured agent (409 problem when the server was started without one)."""
        if self.agent is None:
            raise HTTPProblem(AGENT_NOT_CONFIGURED, "this server has no agent, so it cannot record new threads: "
                                                    "start it with `jixu serve --agent MODULE:FACTORY`")
        return self.agent


def services(request: Request) -> Services:
    """The :class:`Services` of the app serving ``request``."""
    found: Services = request.app.state.jixu
    return found


def client_address(request: Request) -> str:
    """The address failed authentications are counted by (as the server sees the client; behind a proxy, let
    uvicorn's ``--proxy-headers`` / ``--forwarded-allow-ips`` make it the client's own)."""
    return request.client.host if request.client else "unknown"


def principal(request: Request) -> Principal:
    """FastAPI dependency: the authenticated caller (401 problem without a valid bearer token).

    A request with more than one ``Authorization`` header is refused: which one a proxy or a server reads is
    not something a caller should have to guess. Failed attempts are rate-limited per client address and token
    id (429, :mod:`jixu.server.guard`).
    """
    cached = authenticated_caller(request)
    if cached is not None:
        return cached
    sent = request.headers.getlist("authorization")
    if len(sent) > 1:
        raise HTTPProblem(UNAUTHORIZED, f"send one Authorization header; this request has {len(sent)}")
    found = services(request).guard.authenticate(client_address(request), sent[0] if sent else None)
    request.state.principal = found
    return found


def authenticated_caller(request: Request) -> Principal | None:
    """The caller :func:`principal` already authenticated for ``request``, if it did (no store read)."""
    cached = getattr(request.state, "principal", None)
    return cached if isinstance(cached, Principal) else None


class Authenticated(APIRoute):
    """A route that authenticates its caller before anything else, before its body is even parsed: an
    unauthenticated caller gets 401 whatever it sent, never a 422 that describes the route's validation."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            await run_in_threadpool(principal, request)
            return await handler(request)

        return authenticated


@dataclass
class Context:
    """One request's caller, services and request id."""

    request: Request
    services: Services
    principal: Principal

    @property
    def store(self) -> Store:
        """The ledger."""
        return self.services.store

    @property
    def actor(self) -> str:
        """The actor recorded in the events this request causes."""
        return self.principal.actor

    def mutate(self, body: BaseModel | dict[str, Any] | None, operation: Callable[[], Outcome]) -> JSONResponse:
        """Run a mutation at most once per ``Idempotency-Key`` and answer with its (original) response."""
        payload = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        outcome = run_once(self.store, self.principal.token_id, self.request.headers.get(HEADER),
                           method=self.request.method, path=self.request.url.path, body=payload,
                           actor=self.actor, operation=operation)
        headers = {REPLAYED_HEADER: "true"} if outcome.replayed else None
        if not outcome.replayed:
            for nudge in self.services.work_queued:
                nudge()
        return JSONResponse(outcome.body, status_code=outcome.status, headers=headers)


async def context(request: Request) -> Context:
    """FastAPI dependency: the request's :class:`Context` (authenticates the caller).

    A coroutine, so FastAPI runs it on the event loop: a synchronous dependency costs the loop a hop to a
    worker thread and back for each request. Routes of :class:`Authenticated` have their caller by now;
    any other caller is authenticated in a worker thread (the token is read from the store).
    """
    caller = authenticated_caller(request)
    if caller is None:
        caller = await run_in_threadpool(principal, request)
    return Context(request, services(request), caller)


async def mutation(ctx: Annotated[Context, Depends(context)],
             idempotency_key: Annotated[str | None, Header(
                 alias=HEADER, pattern=REQUEST_ID_PATTERN.pattern,
                 description="A request id: a repeat with the same id and body gets the original answer and "
                             "changes nothing; the same id with another body is 422.")] = None) -> Context:
    """FastAPI dependency of a mutation: its :class:`Context`, with the ``Idempotency-Key`` header documented
    and checked (:meth:`Context.mutate` reads it). Two of them are refused (422), as two ``Authorization``
    headers are: which one a proxy or a server reads differs, so the request's id would be a guess."""
    sent = ctx.request.headers.getlist(HEADER)
    if len(sent) > 1:
        raise InvalidInput(f"send one {HEADER} header; this request has {len(sent)}", field=HEADER)
    return ctx


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one of the async Python APIs from a synchronous route (routes run in worker threads)."""
    return asyncio.run(coroutine)


__all__ = ["REPLAYED_HEADER", "Authenticated", "Context", "Services", "client_address", "context", "mutation", "principal", "run_async",
           "services"]
