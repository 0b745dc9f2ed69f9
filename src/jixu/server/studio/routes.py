"""The Studio's pages and form posts under ``/studio``.

Pages are rendered on the server (Jinja2, autoescaped). Posts are plain HTML
forms: each checks the session's CSRF token, then performs the *same*
operation as the HTTP API by calling its route functions with the caller's
:class:`~jixu.server.context.Context` — so authorization (403 for a role that
is too weak, 404 outside the caller's projects), validation and the wake-up
of workers are the API's own. A successful post redirects back (303); a
refused one renders the page again with the problem and its HTTP status (for
example the 409 of a reconciliation without proof, explained in place).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from importlib import resources
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError

from jixu.errors import InvalidInput, JixuError
from jixu.server import runs as runs_api
from jixu.server import threads as threads_api
from jixu.server.auth import Principal
from jixu.server.context import Context, run_async, services
from jixu.server.models import (
    CancelRun,
    Decision,
    ForkThread,
    Handoff,
    Inspect,
    ResolveOutcome,
    ResolveRequest,
    ResumeRun,
    RetryRun,
    SendInput,
)
from jixu.server.problems import UNAUTHORIZED, HTTPProblem, status_of
from jixu.server.studio import views
from jixu.server.studio.session import (
    CSRF_FIELD,
    check_token,
    clear_session,
    csrf_token,
    end_session,
    read_form,
    require_csrf,
    same_origin,
    session_principal,
    session_token,
    set_session,
)

PREFIX = "/studio"
STATIC = {"studio.css": "text/css; charset=utf-8", "studio.js": "text/javascript; charset=utf-8"}
# Scripts and styles come only from /studio/static: no inline script can run, forms post only here.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NOTICES = {
    "resolved": "Resolution recorded. A worker continues the thread if nothing else is open.",
    "approved": "Approved: a worker dispatches the call.",
    "denied": "Denied: the model is told.",
    "sent": "Input queued: a worker runs the turn.",
    "forked": "Forked: this is the child thread.",
    "resumed": "Resumed: the workspace was reconciled and the run is queued for a worker.",
    "handed_off": "Handed off: a new provider snapshot and plan revision were recorded.",
    "retried": "Retried: this is the new run.",
    "cancelled": "Cancelled.",
    "reconciled": "Reconciled: the retained evidence settled the request.",
    "inspected": "Inspected: what the provider shows now is retained in the request (nothing was changed there).",
    "request_resolved": "Resolution recorded: it cites the latest inspection.",
}

_env = Environment(loader=PackageLoader("jixu.server.studio", "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True), trim_blocks=True,
                   lstrip_blocks=True)

router = APIRouter(prefix=PREFIX, include_in_schema=False)


def _render(request: Request, template: str, http_status: int = 200, /, **values: Any) -> HTMLResponse:
    principal: Principal | None = values.pop("principal", None)
    token = session_token(request) if principal is not None else None
    notice = NOTICES.get(request.query_params.get("done", ""))
    html = _env.get_template(template).render(
        principal=principal, csrf_field=CSRF_FIELD, csrf=csrf_token(token) if token else "", notice=notice,
        prefix=PREFIX, **values)
    return HTMLResponse(html, status_code=http_status, headers=SECURITY_HEADERS)


def _problem(error: JixuError) -> dict[str, Any]:
    status = error.status if isinstance(error, HTTPProblem) else status_of(error)
    return {"status": status, "code": error.code, "message": error.message, "details": views.pretty(error.details),
            "result": error.details.get("result")}


def _error_page(request: Request, principal: Principal | None, error: JixuError) -> HTMLResponse:
    problem = _problem(error)
    return _render(request, "error.html", problem["status"], principal=principal, problem=problem,
                   title=f"{problem['status']} {error.code}")


def _login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}", status_code=303)


def _safe_next(value: str | None) -> str:
    # Only a Studio path: never an absolute URL another site could smuggle in.
    if value and value.startswith(f"{PREFIX}/") and not value.startswith("//") and "\\" not in value:
        return value
    return f"{PREFIX}/threads"


def _page(request: Request, build: Callable[[Context], dict[str, Any]], template: str, title: str,
          status: int = 200, problem: dict[str, Any] | None = None) -> Response:
    principal = session_principal(request)
    if principal is None:
        return _login_redirect(request)
    ctx = Context(request, services(request), principal)
    try:
        values = build(ctx)
    except JixuError as error:
        return _error_page(request, principal, error)
    return _render(request, template, status, principal=principal, title=title, problem=problem, **values)


# --- login -------------------------------------------------------------------------------------


@router.get("")
@router.get("/")
def home(request: Request) -> Response:
    """The threads list (or the login page)."""
    return RedirectResponse(f"{PREFIX}/threads", status_code=303)


@router.get("/login")
def login_page(request: Request, next: str | None = None) -> Response:
    """The token login form."""
    return _render(request, "login.html", title="Log in", next=_safe_next(next), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the pasted token; keep it in the session cookie and go on, or show why not (401)."""
    form = await read_form(request)
    target = _safe_next(form.get("next"))
    if not same_origin(request):
        return _render(request, "login.html", 403, title="Log in", next=target,
                       error="This login form was posted from another site.")
    token = form.get("token", "").strip()
    try:
        await asyncio.to_thread(check_token, request, token)
    except HTTPProblem as error:
        message = error.message if token else "Paste a bearer token (jixu_<id>_<secret>)."
        return _render(request, "login.html", error.status if token else 401, title="Log in", next=target,
                       error=message)  # 401, or 429 while this address or token failed too often
    response = RedirectResponse(target, status_code=303)
    set_session(response, request, token)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Forget the session (needs the CSRF token, so another site cannot log you out)."""
    form = await read_form(request)
    try:
        require_csrf(request, form)
    except HTTPProblem as error:
        return _error_page(request, session_principal(request), error)
    await asyncio.to_thread(end_session, request)
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    clear_session(response)
    return response


@router.get("/static/{name}")
def static(name: str) -> Response:
    """The Studio's stylesheet and script (packaged with jixu: no CDN, works offline)."""
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    body = resources.files("jixu.server.studio").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache",
                                                            "X-Content-Type-Options": "nosniff"})


# --- pages -------------------------------------------------------------------------------------


@router.get("/threads")
def threads_list(request: Request) -> Response:
    """Every thread the caller may see."""
    return _page(request, lambda ctx: {"threads": views.thread_rows(ctx)}, "threads.html", "Threads")


@router.get("/threads/{thread_id}")
def thread_detail(request: Request, thread_id: str) -> Response:
    """One thread's timeline and controls."""
    return _page(request, lambda ctx: views.thread_page(ctx, thread_id), "thread.html", f"Thread {thread_id}")


@router.get("/runs")
def runs_list(request: Request) -> Response:
    """Every run the caller may see."""
    return _page(request, lambda ctx: {"runs": views.run_rows(ctx)}, "runs.html", "Runs")


@router.get("/runs/{run_id}")
def run_detail(request: Request, run_id: str) -> Response:
    """One run: plan, tasks, journal, failed checks, execution requests and controls."""
    return _page(request, lambda ctx: views.run_page(ctx, run_id), "run.html", f"Run {run_id}")


def _head(request: Request, read: Callable[[Context], dict[str, Any]]) -> Response:
    principal = session_principal(request)
    if principal is None:
        return JSONResponse({"error": "not logged in"}, status_code=401, headers={"Cache-Control": "no-store"})
    try:
        body = read(Context(request, services(request), principal))
    except JixuError as error:
        return JSONResponse({"error": error.code}, status_code=_problem(error)["status"])
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


@router.get("/threads/{thread_id}/head")
def thread_head(request: Request, thread_id: str) -> Response:
    """The thread's seq and status, polled by the page for live updates."""
    return _head(request, lambda ctx: views.thread_head(ctx, thread_id))


@router.get("/runs/{run_id}/head")
def run_head(request: Request, run_id: str) -> Response:
    """The run's seq and status, polled by the page for live updates."""
    return _head(request, lambda ctx: views.run_head(ctx, run_id))


# --- posts -------------------------------------------------------------------------------------


Action = Callable[[Context, dict[str, str]], str]


async def _post(request: Request, action: Action, page: Callable[[Context], dict[str, Any]], template: str,
                title: str) -> Response:
    """CSRF check, the operation (in a worker thread), then 303 to where it says; on refusal the page again."""
    principal = session_principal(request)
    if principal is None:
        return _error_page(request, None, HTTPProblem(UNAUTHORIZED, "log in first: your session has no valid token"))
    form = await read_form(request)
    ctx = Context(request, services(request), principal)
    try:
        require_csrf(request, form)
        location = await asyncio.to_thread(action, ctx, form)
    except JixuError as error:
        problem = _problem(error)
        try:
            values = await asyncio.to_thread(page, ctx)
        except JixuError:
            return _error_page(request, principal, error)
        return _render(request, template, problem["status"], principal=principal, title=title, problem=problem,
                       **values)
    except ValidationError as error:
        invalid = InvalidInput("; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'form'}: {e['msg']}"
                                         for e in error.errors()))
        try:
            values = await asyncio.to_thread(page, ctx)
        except JixuError:
            return _error_page(request, principal, invalid)
        return _render(request, template, 422, principal=principal, title=title, problem=_problem(invalid),
                       **values)
    return RedirectResponse(location, status_code=303)


def _text(form: dict[str, str], name: str) -> str | None:
    value = form.get(name, "").strip()
    return value or None


def _thread_post(request: Request, thread_id: str, action: Action) -> Coroutine[Any, Any, Response]:
    return _post(request, action, lambda ctx: views.thread_page(ctx, thread_id), "thread.html",
                 f"Thread {thread_id}")


def _run_post(request: Request, run_id: str, action: Action) -> Coroutine[Any, Any, Response]:
    return _post(request, action, lambda ctx: views.run_page(ctx, run_id), "run.html", f"Run {run_id}")


@router.post("/threads/{thread_id}/effects/{effect_id}/resolve")
async def resolve_effect(request: Request, thread_id: str, effect_id: str) -> Response:
    """Record an operator's resolution of an unknown effect (a note is required)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        body = ResolveOutcome.model_validate({"resolution": form.get("resolution", ""),
                                              "note": form.get("note", "").strip(),
                                              "resolution_id": _text(form, "resolution_id")})
        threads_api.resolve_effect(thread_id, effect_id, body, ctx)
        return f"{PREFIX}/threads/{thread_id}?done=resolved"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/effects/{effect_id}/approve")
async def approve_effect(request: Request, thread_id: str, effect_id: str) -> Response:
    """Approve a parked call."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        threads_api.approve_effect(thread_id, effect_id, Decision(note=_text(form, "note")), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=approved"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/effects/{effect_id}/deny")
async def deny_effect(request: Request, thread_id: str, effect_id: str) -> Response:
    """Deny a parked call."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        threads_api.deny_effect(thread_id, effect_id, Decision(note=_text(form, "note")), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=denied"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/fork")
async def fork_thread(request: Request, thread_id: str) -> Response:
    """Fork the thread at an event (optionally starting the child's first turn)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        response = threads_api.fork_thread(thread_id, ForkThread(at=form.get("at", ""), input=_text(form, "input")),
                                           ctx)
        child = _json(response)["thread_id"]
        return f"{PREFIX}/threads/{child}?done=forked"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/inputs")
async def send_input(request: Request, thread_id: str) -> Response:
    """Send input to an idle thread (starts a turn a worker runs)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        threads_api.send_input(thread_id, SendInput(input=form.get("input", "")), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=sent"

    return await _thread_post(request, thread_id, action)


@router.post("/runs/{run_id}/resume")
async def resume_run(request: Request, run_id: str) -> Response:
    """Resume a paused, interrupted or unreconciled run."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.resume_run(run_id, ResumeRun(note=_text(form, "note")), ctx)
        return f"{PREFIX}/runs/{run_id}?done=resumed"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/handoff")
async def handoff_run(request: Request, run_id: str) -> Response:
    """Hand the run to another configured provider."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.handoff_run(run_id, Handoff(agent=form.get("agent", ""), note=_text(form, "note")), ctx)
        return f"{PREFIX}/runs/{run_id}?done=handed_off"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/retry")
async def retry_run(request: Request, run_id: str) -> Response:
    """Retry a failed or cancelled run as a fresh run."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        response = runs_api.retry_run(run_id, RetryRun(provider=_text(form, "provider")), ctx)
        return f"{PREFIX}/runs/{_json(response)['run_id']}?done=retried"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, run_id: str) -> Response:
    """Cancel the run."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.cancel_run(run_id, CancelRun(reason=_text(form, "reason")), ctx)
        return f"{PREFIX}/runs/{run_id}?done=cancelled"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/requests/{request_id}/reconcile")
async def reconcile_request(request: Request, run_id: str, request_id: str) -> Response:
    """Reconcile an execution request from retained evidence (409 explained when there is no proof)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.authorize(ctx, run_id, "operator")
        run_async(ctx.services.runs.reconcile_execution_request(
            run_id, request_id, form.get("reconciliation_id", ""), actor=ctx.actor))
        return f"{PREFIX}/runs/{run_id}?done=reconciled#request-{request_id}"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/requests/{request_id}/inspect")
async def inspect_request(request: Request, run_id: str, request_id: str) -> Response:
    """Ask the request's provider, read-only, what it shows now; the finding is retained in the request."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.inspect_remote(run_id, request_id, Inspect(), ctx)
        return f"{PREFIX}/runs/{run_id}?done=inspected#request-{request_id}"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/requests/{request_id}/resolve")
async def resolve_request(request: Request, run_id: str, request_id: str) -> Response:
    """Record an operator's resolution of an unknown request, citing the latest inspection (note required)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        body = ResolveRequest.model_validate({"resolution": form.get("resolution", ""),
                                              "note": form.get("note", "").strip(),
                                              "resolution_id": _text(form, "resolution_id")})
        runs_api.resolve_request(run_id, request_id, body, ctx)
        return f"{PREFIX}/runs/{run_id}?done=request_resolved#request-{request_id}"

    return await _run_post(request, run_id, action)


def _json(response: Response) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(bytes(response.body))
    return body


__all__ = ["PREFIX", "router"]
